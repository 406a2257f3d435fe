package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// privateServer is what the private servers share: their dir, the running process, and
// Kill and Restart as a crash and a restart on the same data.
type privateServer struct {
	t     testing.TB
	dir   string
	proc  *privateProc
	start func() // starts the server on its data and waits until it takes connections
}

// Kill stops the server as a crash would (SIGKILL to it and every process it forked).
func (s *privateServer) Kill() {
	s.proc.kill()
	s.proc = nil
}

// Restart kills the server and starts it again on the same data.
func (s *privateServer) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// privateProc is one run of a private server (RabbitMQ, Postgres, ClickHouse) in a process
// group of its own, so that a kill reaches every process it forked, as a crash of the
// machine's service would.
type privateProc struct {
	cmd *exec.Cmd
}

// startPrivate starts cmd with its output in dir/server.out and polls ready until it returns
// nil, failing t with the last error and the output if that takes over within.
func startPrivate(t testing.TB, what, dir string, cmd *exec.Cmd, within time.Duration, ready func() error) *privateProc {
	t.Helper()
	p, wait := spawnPrivate(t, what, dir, cmd, within, ready)
	wait()
	return p
}

// spawnPrivate is startPrivate without the wait: wait polls ready, in t's goroutine.
func spawnPrivate(t testing.TB, what, dir string, cmd *exec.Cmd, within time.Duration, ready func() error) (p *privateProc, wait func()) {
	t.Helper()
	outPath := filepath.Join(dir, "server.out")
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	p = &privateProc{cmd: cmd}
	deadline := time.Now().Add(within)
	return p, func() {
		t.Helper()
		for {
			err := ready()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				p.kill()
				b, _ := os.ReadFile(outPath)
				t.Fatalf("%s not ready within %s: %v\n%s", what, within, err, b)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// kill SIGKILLs the whole process group and the server's own children (a Postgres backend
// leads a session of its own), and returns once they are all gone; nil does nothing.
func (p *privateProc) kill() {
	if p == nil {
		return
	}
	pid := p.cmd.Process.Pid
	// Stopped first, the server forks nothing between the listing and the kill.
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	children := childrenOf(pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = p.cmd.Wait()
	// Reparented, the children are not ours to wait for: poll until each is gone or a zombie
	// (which holds no shared memory any more).
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range children {
		for alive(c) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so parse after its closing paren.
		i := strings.LastIndexByte(string(b), ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			out = append(out, c)
		}
	}
	return out
}

// alive says whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// privateDir is a fresh temp dir for a private server, removed at the end of the test.
func privateDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// needBinary fails t unless path exists, saying which Debian package has it.
func needBinary(t testing.TB, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not found (%v): install the %s Debian package (`go tool task test` does)", path, err, pkg)
	}
}
