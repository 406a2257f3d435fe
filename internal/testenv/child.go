package testenv

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
)

// ChildMain is a crash test's TestMain: when the variable env is set, this test binary is
// a child started by StartChild, so it arms the crash point named by LOCKS_CRASHPOINT,
// runs child and exits with its code; otherwise it runs the tests.
func ChildMain(m *testing.M, env string, child func() int) {
	if os.Getenv(env) != "" {
		crashpoint.ArmFromEnv()
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// Child is the test binary re-executed as a child process (a part that a crash test kills).
type Child struct {
	cmd  *exec.Cmd
	done chan struct{}
	code int
}

// StartChild re-executes the test binary, with env (NAME=value) added to its environment
// and running no test, so that ChildMain takes over when env names its variable; the
// child's output goes to out (nil: the test's log). The child is stopped when the test ends.
func StartChild(t testing.TB, out io.Writer, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	if out == nil {
		out = ChildLog(t, "child: ", nil)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
		}
		close(c.done)
	}()
	t.Cleanup(func() { c.Stop(t, 20*time.Second) })
	return c
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// ExitCode is the child's exit code once Done is closed (crashpoint.ExitCode at a crash
// point; -1 when a signal ended it).
func (c *Child) ExitCode() int { return c.code }

// Kill ends the child at once and waits for it.
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Stop sends SIGTERM and waits for the child to exit; one that does not within grace is
// killed and fails t.
func (c *Child) Stop(t testing.TB, grace time.Duration) {
	if c.Exited() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		c.Kill()
		t.Errorf("child process did not stop on SIGTERM within %s", grace)
	}
}

// ChildLog is a writer that logs each line of a child's output to t with prefix, leaving
// out the lines for which skip (if set) holds.
func ChildLog(t testing.TB, prefix string, skip func(line string) bool) io.Writer {
	return childLog{t: t, prefix: prefix, skip: skip}
}

type childLog struct {
	t      testing.TB
	prefix string
	skip   func(string) bool
}

func (w childLog) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if w.skip == nil || !w.skip(l) {
			w.t.Log(w.prefix + l)
		}
	}
	return len(p), nil
}
