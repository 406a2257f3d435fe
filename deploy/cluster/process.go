package cluster

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process gets after SIGTERM before it is killed; locks run itself
// gives its parts 15 s.
const stopGrace = 20 * time.Second

// Process is one child of the cluster: a NATS node or a `locks run`.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// start runs cmd with each line of its output prefixed by name on out, so that twelve
// processes on one terminal stay readable.
func start(name string, cmd *exec.Cmd, out io.Writer, mu *sync.Mutex) (*Process, error) {
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	// Its own process group: Ctrl-C on the terminal reaches the cluster, which stops the
	// children in order, instead of every child at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			mu.Lock()
			fmt.Fprintf(out, "%-12s %s\n", name, sc.Bytes())
			mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r) // a line over 1 MiB: keep the child from blocking
	}()
	go func() {
		p.err = cmd.Wait()
		_ = w.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process exited; valid once Done is closed.
func (p *Process) Err() error { return p.err }

// Signal sends sig to the process (SIGKILL or SIGSTOP for fault tests).
func (p *Process) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop asks the process to stop (SIGTERM, SIGCONT in case it was stopped) and kills it
// after stopGrace.
func (p *Process) Stop() {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	_ = p.Cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}
