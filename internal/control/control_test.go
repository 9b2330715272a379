package control

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kconsume/kconsume/internal/testenv"
)

// echo answers every command with its name.
type echo struct{}

func (echo) Do(cmd string, cpu int, arg string) (string, error) { return cmd + "\n", nil }
func (echo) Files() map[string]string                           { return map[string]string{"state": "running"} }

// TestMain runs the child of TestSendPermissionDenied when asked to:
// Sessions and Send on the root and session named in its environment,
// their replies and errors on standard output.
func TestMain(m *testing.M) {
	if root := os.Getenv("KC_CONTROL_ROOT"); root != "" {
		names, err := Sessions(root)
		os.Stdout.WriteString("sessions " + strings.Join(names, ",") + " " + errString(err) + "\n")
		out, err := Send(root, os.Getenv("KC_CONTROL_NAME"), "status", -1, "")
		os.Stdout.WriteString("send " + strings.TrimSpace(out) + " " + errString(err) + "\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestSendNotRunning: a session that does not exist is "not running".
func TestSendNotRunning(t *testing.T) {
	_, err := Send(t.TempDir(), "nosuch", "status", -1, "")
	if err == nil || !strings.Contains(err.Error(), `session "nosuch" is not running`) {
		t.Fatalf("Send to no session: %v", err)
	}
}

// TestSendPermissionDenied runs a user who is not root against a running
// session: Send and Sessions say the permission is missing and to run as
// root, never that the session is not running, while root reaches it.
func TestSendPermissionDenied(t *testing.T) {
	testenv.RequireRoot(t)
	// As /run is: open to all, its kconsume directory root's alone.
	parent, err := os.MkdirTemp("", "kc-control")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(parent, "kconsume")
	srv, err := Serve(root, "web", echo{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if out, err := Send(root, "web", "status", -1, ""); err != nil || out != "status\n" {
		t.Fatalf("root's Send: %q, %v", out, err)
	}
	// The test binary, where nobody may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(parent, "control.test")
	if err := copyFile(self, bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "KC_CONTROL_ROOT="+root, "KC_CONTROL_NAME=web")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as nobody: %v\n%s", err, out)
	}
	for _, want := range []string{"sessions  sessions: permission denied on " + root + ": run as root", `send  session "web": permission denied on its control socket: run as root`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("as nobody, want %q in:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "not running") {
		t.Errorf("as nobody, a running session said not running:\n%s", out)
	}
}

// copyFile copies src to an executable dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
