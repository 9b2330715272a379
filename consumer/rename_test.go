package consumer

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kconsume/kconsume/consumer/recorder"

	"github.com/kconsume/kconsume/consumer/tracefs"
	"github.com/kconsume/kconsume/gen"
	"github.com/kconsume/kconsume/internal/testenv"
	"github.com/kconsume/kconsume/relayfmt"
	"golang.org/x/sys/unix"
)

// renameComm is the NUL-terminated name the "rename" child gives itself
// on its i-th call.
func renameComm(i int) []byte { return []byte(fmt.Sprintf("kc-rn-%d\x00", i)) }

// TestTaskRename: task:task_rename, a 46-byte record (two comm strings
// and a trailing short), goes into the ring by the recorder's tp_btf
// program where there are BPF ring buffers, by the recorder copy of its
// size on its tracepoint (KC_NO_BTF's path) where there are cookies too,
// and every field of every call of a child comes out as the kernel gave
// it on each path.
func TestTaskRename(t *testing.T) {
	renameOnBTF(t)
	const n = 2000
	type path struct {
		tr    Transport
		noBTF bool
	}
	paths := []path{}
	for _, tr := range transports(t) {
		paths = append(paths, path{tr, false})
		if tr == Ringbuf {
			paths = append(paths, path{tr, true})
		}
	}
	for _, p := range paths {
		name := p.tr.String()
		if p.noBTF {
			name += "/tracepoint"
		}
		t.Run(name, func(t *testing.T) {
			recorder.Testing.NoBTF = p.noBTF
			defer func() { recorder.Testing.NoBTF = false }()
			c := startChild(t, "rename", n)
			s, dir := newTestSession(t, Config{Events: []string{"task:task_rename"}, PIDs: []int{c.tid}, Transport: p.tr})
			want := "kc_tp_0"
			switch {
			case p.tr == Ringbuf && !p.noBTF:
				want = gen.RingbufProgKcBtfRename
			case s.rec.UsesCookie() && p.tr == Ringbuf:
				want = "kc_tp_s46"
			case s.rec.UsesCookie():
				want = "kc_tracepoint"
			}
			if s.rec.Progs()[0] != want {
				_, why := s.BTFEvents()
				t.Fatalf("recorded by %s, want %s (BTF path: %v)", s.rec.Progs()[0], want, why)
			}
			// Not 0, so a trailing short left out reads wrong.
			adjf := fmt.Sprintf("/proc/%d/oom_score_adj", c.tid)
			if err := os.WriteFile(adjf, []byte("123"), 0); err != nil {
				t.Fatal(err)
			}
			adj, err := os.ReadFile(adjf)
			if err != nil {
				t.Fatal(err)
			}
			oom, err := strconv.Atoi(strings.TrimSpace(string(adj)))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c.run(t)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			i := 0
			walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
				if it.Kind != relayfmt.EventItem {
					t.Fatalf("%v in the trace", it.Kind)
				}
				newc := strings.TrimSuffix(string(renameComm(i)), "\x00")
				if got := field(vals, "newcomm").Text(); string(got) != newc {
					t.Fatalf("event %d: newcomm %q, want %q", i, got, newc)
				}
				if i > 0 {
					old := strings.TrimSuffix(string(renameComm(i-1)), "\x00")
					if got := field(vals, "oldcomm").Text(); string(got) != old {
						t.Fatalf("event %d: oldcomm %q, want %q", i, got, old)
					}
				}
				if got := field(vals, "pid").Int(0); got != int64(c.tid) {
					t.Fatalf("event %d: pid %d, want %d", i, got, c.tid)
				}
				if got := field(vals, "common_pid").Int(0); got != int64(c.tid) {
					t.Fatalf("event %d: common_pid %d, want %d", i, got, c.tid)
				}
				if got := field(vals, "oom_score_adj").Int(0); got != int64(oom) {
					t.Fatalf("event %d: oom_score_adj %d, want %d", i, got, oom)
				}
				i++
			})
			if i != n {
				t.Fatalf("%d events, want %d", i, n)
			}
		})
	}
}

// renameText renders a task_rename event of ours as ftrace's text output
// prints it (print_fmt), with pid only where the format has it.
func renameText(vals []relayfmt.Value, withPid bool) string {
	str := func(f string) string { return string(field(vals, f).Text()) }
	pid := ""
	if withPid {
		pid = fmt.Sprintf("pid=%d ", field(vals, "pid").Int(0))
	}
	return fmt.Sprintf("%d task_rename: %soldcomm=%s newcomm=%s oom_score_adj=%d",
		field(vals, "common_pid").Int(0), pid, str("oldcomm"), str("newcomm"), field(vals, "oom_score_adj").Int(0))
}

var renameLine = regexp.MustCompile(`^\s*.*-(\d+)\s+\[\d+\].*? (task_rename: .*newcomm=kc-rn.*)$`)

// renameBeside starts recording task:task_rename through the recorder's
// tp_btf program and, beside it, into an ftrace instance named after
// name. It returns whether the kernel's format has the pid field, and a
// function that stops both and returns the renames to a name starting
// "kc-rn", in order: ours and ftrace's as renameText and ftrace print
// them, and the new names we recorded.
func renameBeside(t *testing.T, name string) (withPid bool, stop func() (ours, theirs, names []string)) {
	t.Helper()
	fs, err := tracefs.Find()
	if err != nil {
		t.Fatal(err)
	}
	format, err := fs.Format(tracefs.Event{System: "task", Name: "task_rename"})
	if err != nil {
		t.Fatal(err)
	}
	withPid = slices.ContainsFunc(format.Fields, func(f tracefs.Field) bool { return f.Name == "pid" })
	inst, enable := ftraceInstance(t, fs, name, []string{"task:task_rename"})
	s, dir := newTestSession(t, Config{Events: []string{"task:task_rename"}, Transport: Ringbuf})
	if got, why := s.BTFEvents(); len(got) != 1 {
		t.Fatalf("task_rename is not on the BTF path: %v", why)
	}
	if err := enable("1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return withPid, func() (ours, theirs, names []string) {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := enable("0"); err != nil {
			t.Fatal(err)
		}
		walkTrace(t, dir, func(it *relayfmt.Item, vals []relayfmt.Value) {
			if it.Kind != relayfmt.EventItem {
				t.Fatalf("%v in the trace", it.Kind)
			}
			if n := string(field(vals, "newcomm").Text()); strings.HasPrefix(n, "kc-rn") {
				ours, names = append(ours, renameText(vals, withPid)), append(names, n)
			}
		})
		text, err := os.ReadFile(filepath.Join(inst, "trace"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(text), "\n") {
			if m := renameLine.FindStringSubmatch(line); m != nil {
				theirs = append(theirs, m[1]+" "+m[2])
			}
		}
		return ours, theirs, names
	}
}

// TestTaskRenameMatchFtrace: task_rename recorded by the recorder's tp_btf
// program equals what the kernel's own event writes into an ftrace
// instance recording at the same time, for the three ways a task gets a
// name: an exec whose file name is longer than a comm (cut to 15 bytes),
// a write to its own /proc/self/comm (with an oom_score_adj set), and a
// write to a sibling thread's comm (pid is not common_pid).
func TestTaskRenameMatchFtrace(t *testing.T) {
	testenv.RequireRoot(t)
	requireBTFPath(t)
	renameOnBTF(t)
	withPid, stop := renameBeside(t, "rename")
	// A file name longer than a comm, exec'd: the kernel names the task
	// after its first 15 bytes.
	long := filepath.Join(t.TempDir(), "kc-rn-exec-with-a-long-name")
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sh, long); err != nil {
		t.Fatal(err)
	}
	// The shell names itself once its oom_score_adj is set.
	c := exec.Command(long, "-c", "read -r _; printf kc-rn-self > /proc/self/comm")
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// The exec renames the child some time after Start returns: wait
	// for it, so the renames come in the order the test checks.
	commf := fmt.Sprintf("/proc/%d/comm", c.Process.Pid)
	for end := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if b, err := os.ReadFile(commf); err == nil && strings.TrimSpace(string(b)) == "kc-rn-exec-with" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the exec's name did not come in a minute", commf)
		}
	}
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", c.Process.Pid), []byte("321"), 0); err != nil {
		t.Fatal(err)
	}
	// The kernel takes a write to the comm of a thread of the writer's
	// own process only (fs/proc/base.c:comm_write): one of the test's
	// threads names another.
	runtime.LockOSThread()
	self := unix.Gettid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	sibling := 0
	for _, e := range tasks {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != self && tid != os.Getpid() {
			sibling = tid
			break
		}
	}
	if sibling == 0 {
		t.Fatalf("no other thread than %d and %d in %v", self, os.Getpid(), tasks)
	}
	siblingf := fmt.Sprintf("/proc/self/task/%d/comm", sibling)
	oldName, err := os.ReadFile(siblingf)
	if err != nil {
		t.Fatal(err)
	}
	err = os.WriteFile(siblingf, []byte("kc-rn-sibling"), 0)
	if err == nil {
		err = os.WriteFile(siblingf, oldName, 0)
	}
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	ours, theirs, _ := stop()
	want := []string{"kc-rn-exec-with", "kc-rn-sibling", "kc-rn-self"}
	if len(ours) != len(want) {
		t.Fatalf("%d renames recorded, want %d (%v): %q", len(ours), len(want), want, ours)
	}
	for i, w := range want {
		if !strings.Contains(ours[i], " newcomm="+w+" ") {
			t.Errorf("rename %d: %q, want newcomm %s", i, ours[i], w)
		}
	}
	if !strings.HasPrefix(ours[1], fmt.Sprint(self)+" ") || withPid && !strings.Contains(ours[1], fmt.Sprintf(" pid=%d ", sibling)) {
		t.Errorf("thread %d's rename of thread %d: %q, want that common_pid and pid", self, sibling, ours[1])
	}
	if !strings.HasSuffix(ours[2], "oom_score_adj=321") {
		t.Errorf("the shell's rename: %q, want oom_score_adj 321", ours[2])
	}
	if !slices.Equal(ours, theirs) {
		t.Fatalf("ours and ftrace's differ:\nours   %q\nftrace %q", ours, theirs)
	}
	t.Logf("%d renames equal ftrace's: %q", len(ours), ours)
}

// TestTaskRenamePageEdge: the new name of a task_rename read where it
// ends a page of kernel memory equals ftrace's. An exec names the task
// after its path's last element, read where the kernel copied the path
// (fs/namei.c:getname_flags: into a page-sized names_cache object, from
// its start where the path nears PATH_MAX); paths of 4,048 to 4,095 bytes
// put that name's first byte at each of the last 40-odd bytes of its
// page, where kc_put_str16 may not load 16 bytes at once and takes the
// helper's path, and just before them, where it does.
func TestTaskRenamePageEdge(t *testing.T) {
	testenv.RequireRoot(t)
	requireBTFPath(t)
	renameOnBTF(t)
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	// A chain of directories 3,830 to 4,030 bytes long, so that each
	// path's last directory has 7 to 255 bytes (NAME_MAX).
	dir := t.TempDir()
	for len(dir)+201 <= 4030 {
		dir = filepath.Join(dir, strings.Repeat("d", 200))
	}
	var paths, want []string
	for i := 0; i < 48; i++ {
		name := fmt.Sprintf("kc-rn-e%02d", i)
		// len(path) = len(sub) + 1 + len(name) = 4095 - i.
		sub := filepath.Join(dir, strings.Repeat("e", 4095-i-len(name)-1-len(dir)-1))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(sub, name)
		if err := os.Symlink(truePath, p); err != nil {
			t.Fatal(err)
		}
		if len(p) != 4095-i {
			t.Fatalf("path of %d bytes, want %d", len(p), 4095-i)
		}
		paths, want = append(paths, p), append(want, name)
	}
	_, stop := renameBeside(t, "rename-edge")
	for _, p := range paths {
		if out, err := exec.Command(p).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", p, err, out)
		}
	}
	ours, theirs, names := stop()
	if !slices.Equal(names, want) {
		t.Errorf("new names %q, want %q", names, want)
	}
	if !slices.Equal(ours, theirs) {
		t.Fatalf("ours and ftrace's differ:\nours   %q\nftrace %q", ours, theirs)
	}
}

// renameOnBTF keeps task_rename on its BTF program for t, where programs
// run preemptibly too: t checks the program's fields, not its losses.
func renameOnBTF(t *testing.T) {
	recorder.Testing.RenameBTF = true
	t.Cleanup(func() { recorder.Testing.RenameBTF = false })
}
