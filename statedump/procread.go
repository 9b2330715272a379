package statedump

import (
	"bytes"
	"strconv"

	"golang.org/x/sys/unix"
)

// procReader reads the small /proc files and links the statedump needs
// per task and per descriptor with plain system calls into one reused
// buffer: at 1,000 processes the allocations, finalizers and parsers of
// a general reader cost as much as the kernel's side (see BENCHMARKS.md).
type procReader struct {
	buf []byte
}

func newProcReader() *procReader { return &procReader{buf: make([]byte, 4096)} }

// readlink returns the target of the link at path, or false when it
// cannot be read (the task or descriptor is gone).
func (r *procReader) readlink(path string) (string, bool) {
	for {
		n, err := unix.Readlink(path, r.buf)
		if err != nil {
			return "", false
		}
		if n < len(r.buf) {
			return string(r.buf[:n]), true
		}
		r.buf = make([]byte, 2*len(r.buf)) // a long path: PATH_MAX at most
	}
}

// nsInode returns the inode number of the namespace at path
// (/proc/PID/ns/KIND): stat follows the link to the nsfs inode, whose
// number is the one "KIND:[N]" shows. false when it cannot be read.
func (r *procReader) nsInode(path string) (uint32, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	return uint32(st.Ino), true
}

// read returns the start of the file at path (what fits the buffer), or
// false when it cannot be read. The bytes are valid until the next call.
func (r *procReader) read(path string) ([]byte, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	n := 0
	for n < len(r.buf) {
		m, err := unix.Read(fd, r.buf[n:])
		if err != nil {
			return nil, false
		}
		if m == 0 {
			break
		}
		n += m
	}
	return r.buf[:n], true
}

// fdFlags returns the file flags /proc/PID/fdinfo/FD gives (octal, the
// file's f_flags, fs/proc/fd.c seq_show), or false.
func (r *procReader) fdFlags(path string) (uint64, bool) {
	b, ok := r.read(path)
	if !ok {
		return 0, false
	}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("flags:")); ok {
			f, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 32)
			return f, err == nil
		}
	}
	return 0, false
}
