package timerfd

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFiresOnce(t *testing.T) {
	tm, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	start := time.Now()
	if err := tm.Reset(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tm.C():
	case <-time.After(time.Minute):
		t.Fatal("no expiry within a minute of a 20 ms timer")
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("fired after %v, before its 20 ms", d)
	}
	select {
	case <-tm.C():
		t.Fatal("a one-shot timer fired twice")
	case <-time.After(60 * time.Millisecond):
	}
}

func TestStopAndReset(t *testing.T) {
	// Reset, then Stop before the timer is due. A thread descheduled
	// between the two for the timer's 30 ms lets it fire first, which
	// says nothing of Stop: such a try, Reset to Stop taking 20 ms or
	// more, is made again on a new timer.
	var tm *Timer
	for try := 1; ; try++ {
		var err error
		if tm, err = New(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := tm.Reset(30 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := tm.Stop(); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) < 20*time.Millisecond {
			break
		}
		tm.Close()
		if try == 100 {
			t.Fatal("Reset to Stop took 20 ms or more 100 times")
		}
	}
	defer tm.Close()
	// Disarmed in the kernel: no expiry is due, however late this
	// thread looks. The wait on C below then sees one that fires anyway.
	var cur unix.ItimerSpec
	if err := unix.TimerfdGettime(tm.fd, &cur); err != nil {
		t.Fatal(err)
	}
	if cur.Value != (unix.Timespec{}) {
		t.Fatalf("a stopped timer is due in %v", time.Duration(cur.Value.Nano()))
	}
	select {
	case <-tm.C():
		t.Fatal("a stopped timer fired")
	case <-time.After(80 * time.Millisecond):
	}
	// A later Reset replaces an earlier one: the timer fires at the
	// later setting, once.
	if err := tm.Reset(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tm.Reset(10 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tm.C():
	case <-time.After(time.Minute):
		t.Fatal("a reset timer did not fire in a minute")
	}
}

func TestCloseEndsWait(t *testing.T) {
	tm, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := tm.Reset(time.Hour); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { tm.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Close did not end the timer's wait in a minute")
	}
}

// TestFuncBeforeC: NewFunc's function runs once per expiry, on the
// timer's goroutine, before C receives.
func TestFuncBeforeC(t *testing.T) {
	calls := make(chan int, 4)
	n := 0
	tm, err := NewFunc(func() { n++; calls <- n })
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	for want := 1; want <= 2; want++ {
		if err := tm.Reset(5 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		select {
		case <-tm.C():
		case <-time.After(time.Minute):
			t.Fatalf("expiry %d: nothing on C in a minute", want)
		}
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("call %d at expiry %d", got, want)
			}
		default:
			t.Fatalf("expiry %d reached C before the function ran", want)
		}
	}
	select {
	case got := <-calls:
		t.Fatalf("call %d without an expiry", got)
	case <-time.After(30 * time.Millisecond):
	}
}
