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
// not end a later Wait. The wake comes long before the timeout (a TCG
// guest once took over 40 ms to run a goroutine due after 5), and the
// later Wait lasts past the time the first timeout would have fired.
func TestEarlyWakeDisarms(t *testing.T) {
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	events := make([]unix.EpollEvent, 2)
	const timeout = time.Second
	t0 := time.Now()
	go func() {
		time.Sleep(5 * time.Millisecond)
		p.Wake()
	}()
	if got, err := p.Wait(events, nil, timeout); err != nil || !slices.Equal(got, []int32{WakeID}) {
		t.Fatalf("first Wait = %v, %v after %v", got, err, time.Since(t0))
	}
	wake := t0.Add(timeout + 200*time.Millisecond)
	go func() {
		time.Sleep(time.Until(wake))
		p.Wake()
	}()
	got, err := p.Wait(events, nil, -1)
	if err != nil || !slices.Equal(got, []int32{WakeID}) {
		t.Fatalf("second Wait = %v, %v after %v: the first Wait's timeout ended it", got, err, time.Since(t0))
	}
	if time.Now().Before(wake) {
		t.Fatalf("second Wait returned after %v, before the Wake", time.Since(t0))
	}
}
