// Package control serves a running recording's control directory,
// /run/kconsume/NAME/, in the manner of the kernel's trace control files:
// state (reads "running" or "stopped"; "echo stop > state" and
// "echo start > state" act), dropped (read), rewind (write), nr_sub and
// sub_size (read); and a unix socket, ctl.sock, over which kconsume ctl
// sends commands and gets replies.
//
// A live session holds an exclusive flock on .lock in its directory: a
// directory whose lock is free was left by a killed session and is
// replaced.
package control

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultRoot is where control directories live.
const DefaultRoot = "/run/kconsume"

// Handler carries out commands for a session.
type Handler interface {
	// Do runs cmd (start, stop, flush, snapshot, rewind, reset, status,
	// emit) on every CPU, or on cpu alone when cpu >= 0, with arg (empty
	// for most commands), and returns the reply text.
	Do(cmd string, cpu int, arg string) (string, error)
	// Files returns the current content of the read files: state,
	// dropped, nr_sub, sub_size, and any other name it holds (plain file
	// names, such as relayd_not_sent).
	Files() map[string]string
}

// ErrRunning is returned by Serve when a live session has the name.
var ErrRunning = errors.New("a session with this name is running")

// Server is one session's control directory.
type Server struct {
	dir  string
	h    Handler
	lock *os.File
	ln   net.Listener
	ino  *os.File // inotify on dir, read in the netpoller; closing it ends watch
	wg   sync.WaitGroup
	mu   sync.Mutex // serializes commands
	once sync.Once
	// last holds what Refresh wrote, so the inotify event of our own
	// write is not taken for a user's.
	last map[string]string
}

// Names of the files.
const (
	fileState   = "state"
	fileDropped = "dropped"
	fileRewind  = "rewind"
	fileNrSub   = "nr_sub"
	fileSubSize = "sub_size"
	fileLock    = ".lock"
	fileSocket  = "ctl.sock"
	// Refresh writes its new files here and renames them into place: a
	// rename is no IN_CLOSE_WRITE in the directory watched, so the
	// server's own writes do not wake it.
	dirTmp = ".tmp"
)

// CheckName accepts names usable as one path element.
func CheckName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 64 || strings.ContainsAny(name, "/\x00") || strings.HasPrefix(name, ".") {
		return fmt.Errorf("session name %q: want 1..64 characters, no '/', not starting with '.'", name)
	}
	return nil
}

// Serve creates root/name (root-only permissions), takes its lock, writes
// the files and starts serving. It fails with ErrRunning when another live
// session holds the name; a stale directory is replaced.
func Serve(root, name string, h Handler) (*Server, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("control directory: %w", err)
	}
	dir := filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("control directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, fileLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("control directory: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(lock.Name())
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("session %q (pid %s): %w", name, strings.TrimSpace(string(pid)), ErrRunning)
		}
		return nil, fmt.Errorf("control directory lock: %w", err)
	}
	// The lock is ours: whatever else is here is stale.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != fileLock {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	if err := os.Mkdir(filepath.Join(dir, dirTmp), 0o700); err != nil {
		lock.Close()
		return nil, fmt.Errorf("control directory: %w", err)
	}
	s := &Server{dir: dir, h: h, lock: lock, last: map[string]string{}}
	fail := func(err error) (*Server, error) {
		s.Close()
		return nil, err
	}
	if err := s.Refresh(); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fileRewind), nil, 0o200); err != nil {
		return fail(fmt.Errorf("control directory: %w", err))
	}
	if s.ln, err = net.Listen("unix", filepath.Join(dir, fileSocket)); err != nil {
		return fail(fmt.Errorf("control socket: %w", err))
	}
	if err := os.Chmod(filepath.Join(dir, fileSocket), 0o600); err != nil {
		return fail(err)
	}
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fail(fmt.Errorf("inotify: %w", err))
	}
	// Waited for in the netpoller: a goroutine blocked in poll(2) holds
	// a P, and the runtime's sysmon then polls for milliseconds after
	// each wakeup, context switches in the trace being recorded.
	s.ino = os.NewFile(uintptr(ino), "inotify")
	if _, err := unix.InotifyAddWatch(ino, dir, unix.IN_CLOSE_WRITE); err != nil {
		return fail(fmt.Errorf("inotify: %w", err))
	}
	s.wg.Add(2)
	go s.accept()
	go s.watch()
	return s, nil
}

// Dir returns the control directory.
func (s *Server) Dir() string { return s.dir }

// Refresh rewrites the read files with the handler's current values. Each
// file is replaced by rename, so a reader never sees half a value.
func (s *Server) Refresh() error {
	files := s.h.Files()
	s.mu.Lock()
	defer s.mu.Unlock()
	// state goes last: a reader that sees "running" finds the sizes of
	// that session already in place.
	names := []string{fileDropped, fileNrSub, fileSubSize}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !slices.Contains(names, name) && name != fileState && name != fileRewind && name != fileSocket && CheckName(name) == nil {
			names = append(names, name)
		}
	}
	for _, name := range append(names, fileState) {
		v := files[name] + "\n"
		if s.last[name] == v {
			continue
		}
		tmp := filepath.Join(s.dir, dirTmp, name)
		if err := os.WriteFile(tmp, []byte(v), 0o600); err != nil {
			return fmt.Errorf("control file %s: %w", name, err)
		}
		if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
			return fmt.Errorf("control file %s: %w", name, err)
		}
		s.last[name] = v
	}
	return nil
}

// Stage writes value, as name's next content, into a scratch file now
// and returns the function that puts it in place: one rename, made as a
// raw system call, so that it can run where an ordinary one must not (at
// the gate, where one would wake the Go runtime's sleeping sysmon into
// the trace). A Refresh between the two leaves the staged file alone.
// Stage fails when the scratch file cannot be written; the function
// returned fails with the kernel's error.
func (s *Server) Stage(name, value string) (func() error, error) {
	v := value + "\n"
	tmp := filepath.Join(s.dir, dirTmp, name+".staged")
	if err := os.WriteFile(tmp, []byte(v), 0o600); err != nil {
		return nil, fmt.Errorf("control file %s: %w", name, err)
	}
	from, err := unix.BytePtrFromString(tmp)
	if err != nil {
		return nil, fmt.Errorf("control file %s: %w", name, err)
	}
	to, err := unix.BytePtrFromString(filepath.Join(s.dir, name))
	if err != nil {
		return nil, fmt.Errorf("control file %s: %w", name, err)
	}
	return func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		cwd := unix.AT_FDCWD
		_, _, errno := unix.RawSyscall6(unix.SYS_RENAMEAT2, uintptr(cwd), uintptr(unsafe.Pointer(from)),
			uintptr(cwd), uintptr(unsafe.Pointer(to)), 0, 0)
		if errno != 0 {
			return fmt.Errorf("control file %s: %w", name, errno)
		}
		s.last[name] = v
		return nil
	}, nil
}

func (s *Server) do(cmd string, cpu int, arg string) (string, error) {
	s.mu.Lock()
	out, err := s.h.Do(cmd, cpu, arg)
	s.mu.Unlock()
	_ = s.Refresh()
	return out, err
}

// watch acts on writes to state and rewind.
func (s *Server) watch() {
	defer s.wg.Done()
	buf := make([]byte, 4096)
	for {
		// Close ends the read with os.ErrClosed; the file retries
		// EAGAIN and EINTR itself.
		n, err := s.ino.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_IGNORED != 0 {
				return
			}
			switch strings.TrimRight(string(nameBytes), "\x00") {
			case fileState:
				s.stateWritten()
			case fileRewind:
				_, _ = s.do("rewind", -1, "")
			}
		}
	}
}

// stateWritten reads what a user wrote into state and acts on it.
func (s *Server) stateWritten() {
	b, err := os.ReadFile(filepath.Join(s.dir, fileState))
	if err != nil {
		return
	}
	v := strings.TrimSpace(string(b))
	s.mu.Lock()
	own := s.last[fileState] == v+"\n"
	s.mu.Unlock()
	if own {
		return
	}
	switch v {
	case "start", "running", "1":
		_, _ = s.do("start", -1, "")
	case "stop", "stopped", "0":
		_, _ = s.do("stop", -1, "")
	}
	// Whatever was written, state shows the truth again.
	s.mu.Lock()
	delete(s.last, fileState)
	s.mu.Unlock()
	_ = s.Refresh()
}

// accept serves ctl.sock: one request line "CMD CPU", one reply: "ok" and
// the reply text, or "error MESSAGE".
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			// "CMD CPU" or "CMD CPU QUOTED-ARG" (Go-quoted, one line).
			f := strings.SplitN(strings.TrimRight(line, "\n"), " ", 3)
			var cpu int
			var arg string
			if len(f) >= 2 {
				cpu, err = strconv.Atoi(f[1])
			}
			if len(f) == 3 && err == nil {
				arg, err = strconv.Unquote(f[2])
			}
			if len(f) < 2 || f[0] == "" || err != nil {
				fmt.Fprintf(c, "error bad request %q\n", strings.TrimSpace(line))
				return
			}
			out, err := s.do(f[0], cpu, arg)
			if err != nil {
				fmt.Fprintf(c, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			fmt.Fprintf(c, "ok\n%s", out)
		}()
	}
}

// Close stops serving and removes the directory.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		if s.ln != nil {
			_ = s.ln.Close()
		}
		if s.ino != nil {
			_ = s.ino.Close()
		}
		entries, _ := os.ReadDir(s.dir)
		for _, e := range entries {
			if e.Name() != fileLock {
				_ = os.RemoveAll(filepath.Join(s.dir, e.Name()))
			}
		}
		_ = os.Remove(filepath.Join(s.dir, fileLock))
		err = os.Remove(s.dir)
		s.wg.Wait()
		_ = s.lock.Close()
	})
	return err
}

// Send sends one command to the named session and returns its reply. It
// fails when the session is not running, when the caller may not reach
// its socket (not root: the error says so, the session may be running),
// or with the session's own error for the command.
func Send(root, name, cmd string, cpu int, arg string) (string, error) {
	c, err := net.DialTimeout("unix", filepath.Join(root, name, fileSocket), 5*time.Second)
	switch {
	case errors.Is(err, fs.ErrPermission):
		// The session may well be running: its socket is root's alone.
		return "", fmt.Errorf("session %q: permission denied on its control socket: run as root (%w)", name, err)
	case err != nil:
		return "", fmt.Errorf("session %q is not running (%w)", name, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	req := fmt.Sprintf("%s %d", cmd, cpu)
	if arg != "" {
		req += " " + strconv.Quote(arg)
	}
	if _, err := fmt.Fprintf(c, "%s\n", req); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	status, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("session %q: no reply: %w", name, err)
	}
	if msg, ok := strings.CutPrefix(status, "error "); ok {
		return "", errors.New(strings.TrimSpace(msg))
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	return string(body), nil
}

// Sessions returns the names of the live sessions under root: those whose
// lock is held. It fails when root cannot be read, saying so plainly when
// the caller lacks the permission (root's directories are root's alone).
func Sessions(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case errors.Is(err, fs.ErrPermission):
		return nil, fmt.Errorf("sessions: permission denied on %s: run as root (%w)", root, err)
	case err != nil:
		return nil, fmt.Errorf("sessions: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		f, err := os.Open(filepath.Join(root, e.Name(), fileLock))
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
			out = append(out, e.Name())
		}
		f.Close()
	}
	return out, nil
}
