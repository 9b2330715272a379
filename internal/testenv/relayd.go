package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RelaydPath returns lttng-relayd's path (lttng-tools), skipping t, or
// failing it in strict mode, without it.
func RelaydPath(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("lttng-relayd")
	if err != nil {
		Missing(t, "lttng-relayd is required (apt-get install lttng-tools): %v", err)
	}
	return p
}

// Relayd is a real lttng-relayd a test started on loopback.
type Relayd struct {
	Control, Data, Live int    // ports, chosen free at start
	Out                 string // its output directory
	Log                 string // its log file (verbose, but for StartQuietRelayd's)

	quiet bool
	dir   string
	cmd   *exec.Cmd
	done  chan struct{}
}

// StartRelayd starts lttng-relayd on loopback ports chosen at run time,
// writing into a temporary directory, and stops it when t ends. It fails t
// if relayd does not listen within 10 s.
func StartRelayd(t testing.TB) *Relayd {
	t.Helper()
	return startRelayd(t, false)
}

// StartQuietRelayd is StartRelayd for benchmarks: relayd logs only its
// errors. Verbose, it logs lines for every packet: streaming a saturating
// recording to it on 2 CPUs then lost 10 to 29 % of the events, against
// 0 to 0.1 % to a quiet one.
func StartQuietRelayd(t testing.TB) *Relayd {
	t.Helper()
	return startRelayd(t, true)
}

func startRelayd(t testing.TB, quiet bool) *Relayd {
	t.Helper()
	bin := RelaydPath(t)
	dir := t.TempDir()
	r := &Relayd{Out: filepath.Join(dir, "out"), Log: filepath.Join(dir, "relayd.log"), dir: dir, quiet: quiet}
	var lastErr error
	for range 5 {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatalf("free ports: %v", err)
		}
		r.Control, r.Data, r.Live = ports[0], ports[1], ports[2]
		if lastErr = r.start(bin, dir); lastErr == nil {
			t.Cleanup(r.Stop)
			return r
		}
	}
	t.Fatalf("starting lttng-relayd: %v", lastErr)
	return nil
}

// Restart starts relayd again, after Kill or Stop, on the same ports and
// output directory. It fails t if relayd does not listen within 10 s.
func (r *Relayd) Restart(t testing.TB) {
	t.Helper()
	if err := r.start(RelaydPath(t), r.dir); err != nil {
		t.Fatalf("restarting lttng-relayd: %v", err)
	}
}

// Renice sets the nice value of every thread of relayd (a process's
// nice value is its threads' own on Linux). It fails t when a thread
// cannot be reniced.
func (r *Relayd) Renice(t testing.TB, nice int) {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", r.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("relayd's threads: %v", err)
	}
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("renice relayd thread %d to %d: %v", tid, nice, err)
		}
	}
}

// URL returns net://127.0.0.1:CONTROL:DATA.
func (r *Relayd) URL() string {
	return fmt.Sprintf("net://127.0.0.1:%d:%d", r.Control, r.Data)
}

// LiveURL returns the lttng-live URL of a session for babeltrace2.
func (r *Relayd) LiveURL(host, session string) string {
	return fmt.Sprintf("net://127.0.0.1:%d/host/%s/%s", r.Live, host, session)
}

func (r *Relayd) start(bin, dir string) error {
	log, err := os.OpenFile(r.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	tcp := func(p int) string { return "tcp://127.0.0.1:" + strconv.Itoa(p) }
	args := []string{"-C", tcp(r.Control), "-D", tcp(r.Data), "-L", tcp(r.Live), "-o", r.Out}
	if !r.quiet {
		args = append([]string{"-v"}, args...)
	}
	r.cmd = exec.Command(bin, args...)
	// Its own home: relayd reads $LTTNG_HOME/.lttng/lttng.conf and keeps
	// nothing of the machine's.
	r.cmd.Env = append(os.Environ(), "LTTNG_HOME="+dir)
	r.cmd.Stdout, r.cmd.Stderr = log, log
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.done = make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-r.done:
			b, _ := os.ReadFile(r.Log)
			return fmt.Errorf("lttng-relayd exited: %s", lastLines(string(b), 5))
		default:
		}
		ok := true
		for _, p := range []int{r.Control, r.Data, r.Live} {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), time.Second)
			if err != nil {
				ok = false
				break
			}
			c.Close()
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Kill()
	return errors.New("lttng-relayd did not listen within 10s")
}

// Kill kills relayd at once (SIGKILL), as a crash would, and waits for it.
func (r *Relayd) Kill() {
	if r.cmd.Process == nil {
		return
	}
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	// A killed relayd leaves its health socket behind.
	_ = os.Remove(fmt.Sprintf("/var/run/lttng/relayd/health-%d", r.cmd.Process.Pid))
}

// Pause stops relayd (SIGSTOP), as a stalled link or host would;
// Resume lets it go on.
func (r *Relayd) Pause() { _ = r.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (r *Relayd) Resume() { _ = r.cmd.Process.Signal(syscall.SIGCONT) }

// Stop ends relayd with SIGTERM, or SIGKILL after 5 s.
func (r *Relayd) Stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a paused relayd takes no SIGTERM
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		r.Kill()
	}
}

// LogTail returns the last n lines of relayd's log, for failure messages.
func (r *Relayd) LogTail(n int) string {
	b, _ := os.ReadFile(r.Log)
	return lastLines(string(b), n)
}

// SessionDir returns the one directory relayd wrote for host's session
// name (HOST/NAME-DATE), failing t unless there is exactly one.
func (r *Relayd) SessionDir(t testing.TB, host, name string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(r.Out, host, name+"-*"))
	if len(m) != 1 {
		t.Fatalf("relayd output for %s/%s: want one session directory, found %q\nrelayd log:\n%s", host, name, m, r.LogTail(20))
	}
	return m[0]
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
