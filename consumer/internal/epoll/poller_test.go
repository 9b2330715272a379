package epoll

import (
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPoller(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := p.Add(fds[0], 7); err != nil {
		t.Fatal(err)
	}
	if err := p.Add(fds[0], -2); err == nil {
		t.Fatal("negative id accepted")
	}
	events := make([]unix.EpollEvent, 4)
	ids := make([]int32, 0, 4)

	tests := []struct {
		name    string
		setup   func()
		timeout time.Duration
		want    []int32
	}{
		{name: "timeout", timeout: 10 * time.Millisecond, want: nil},
		{name: "wake", setup: p.Wake, timeout: time.Second, want: []int32{WakeID}},
		{name: "wake consumed", timeout: 10 * time.Millisecond, want: nil},
		{name: "fd", setup: func() { unix.Write(fds[1], []byte{1}) }, timeout: time.Second, want: []int32{7}},
		// Edge-triggered: unread data does not report the fd again.
		{name: "edge", timeout: 10 * time.Millisecond, want: nil},
		{name: "both", setup: func() { p.Wake(); unix.Write(fds[1], []byte{1}) }, timeout: time.Second, want: []int32{WakeID, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			t0 := time.Now()
			got, err := p.Wait(events, ids, tc.timeout)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("ids %v, want %v", got, tc.want)
			}
			if tc.want == nil && time.Since(t0) < tc.timeout/2 {
				t.Fatalf("returned after %v, before its timeout", time.Since(t0))
			}
		})
	}
	p.Close()
	p.Close()
	p.Wake() // after Close: nothing, no panic
}

// TestWakeFromAnotherGoroutine wakes a Wait with no timeout.
func TestWakeFromAnotherGoroutine(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go func() {
		time.Sleep(20 * time.Millisecond)
		p.Wake()
	}()
	got, err := p.Wait(make([]unix.EpollEvent, 2), nil, -1)
	if err != nil || !slices.Equal(got, []int32{WakeID}) {
		t.Fatalf("Wait = %v, %v", got, err)
	}
}

// TestEarlyWakeDisarms ends a Wait before its timeout; the timeout must
// not end a later Wait. The Wake comes once the Wait has armed its
// timeout, seen in the kernel's timerfd, and the timeout is an hour: the
// order is certain on a machine of any speed, where a wake due after
// 5 ms against a 1 s timeout was only likely (a TCG guest once took over
// 40 ms to run a goroutine due after 5). The Wait that returns must
// leave the timerfd disarmed, with no expiry pending, read back from the
// kernel.
func TestEarlyWakeDisarms(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	due := func() time.Duration {
		var cur unix.ItimerSpec
		if err := unix.TimerfdGettime(p.tfd, &cur); err != nil {
			t.Error(err)
		}
		return time.Duration(cur.Value.Nano())
	}
	events := make([]unix.EpollEvent, 2)
	woke := make(chan bool, 1)
	go func() {
		// armed is false when a minute passed with no timeout armed:
		// woken anyway, so that the Wait ends and the test fails.
		armed := false
		for end := time.Now().Add(time.Minute); !armed && time.Now().Before(end); time.Sleep(time.Millisecond) {
			armed = due() > 0
		}
		p.Wake()
		woke <- armed
	}()
	got, err := p.Wait(events, nil, time.Hour)
	if !<-woke {
		t.Fatal("Wait armed no timeout in a minute")
	}
	if err != nil || !slices.Equal(got, []int32{WakeID}) {
		t.Fatalf("first Wait = %v, %v", got, err)
	}
	if d := due(); d != 0 {
		t.Fatalf("after a Wait ended by a Wake its timeout is still due in %v: it would end a later Wait", d)
	}
	// Nothing ready is left over either: a later Wait that must not
	// sleep returns nothing.
	if got, err := p.Wait(events, nil, 0); err != nil || len(got) != 0 {
		t.Fatalf("a later Wait = %v, %v; want nothing", got, err)
	}
}
