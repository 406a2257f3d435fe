package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// cliSystem is a `locks run --targets=all` on the real servers (a database, a queue and a
// ClickHouse database of its own), for the command line's tests.
type cliSystem struct {
	httpAddr, token string
	rabbit          *testenv.RabbitEnv
	log             *testenv.LogBuffer
	// servers is the environment that points a `locks run` at this system's servers.
	servers []string
}

// startCLISystem starts the system with env added to its environment and waits until it is
// ready; it is stopped with SIGTERM when t ends.
func startCLISystem(t *testing.T, env ...string) *cliSystem {
	t.Helper()
	chDB := testenv.Name("locks_cli")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	s := &cliSystem{httpAddr: testenv.FreeAddr(t), token: "cli-token-0123456789abcdef", rabbit: testenv.RabbitMQ(t)}
	s.servers = []string{
		"LOCKS_POSTGRES_URL=" + testenv.PostgresURL(t),
		"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
		"LOCKS_AMQP_URL=" + s.rabbit.URL,
		"LOCKS_AMQP_QUEUE=" + s.rabbit.Queue,
		"LOCKS_API_TOKENS=" + s.token,
		"LOCKS_PARTITIONS=2",
	}
	s.log = startLocks(t, s.httpAddr, append(append(s.servers, env...), "LOCKS_GRPC_ADDR="+testenv.FreeAddr(t)),
		"run", "--targets=all").log
	return s
}

// locksProcess is a running `locks run`.
type locksProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    *testenv.LogBuffer
}

// stop sends sig and waits for the process to exit (at most 20 s, then kills it).
func (p *locksProcess) stop(t *testing.T, sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("locks run did not stop within 20 s of %s", sig)
	}
}

// startLocks runs locks with args and env, serving HTTP on httpAddr, and waits until its
// /readyz answers 200; it is stopped with SIGTERM when t ends, if not before.
func startLocks(t *testing.T, httpAddr string, env []string, args ...string) *locksProcess {
	t.Helper()
	p := &locksProcess{cmd: locksCmd(t, append(env, "LOCKS_HTTP_ADDR="+httpAddr), args...), exited: make(chan struct{}), log: &testenv.LogBuffer{}}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop(t, syscall.SIGTERM)
		if t.Failed() {
			t.Logf("locks %s's log:\n%s", strings.Join(args, " "), p.log)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("locks %s exited before it was ready; log:\n%s", strings.Join(args, " "), p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 60 s; log:\n%s", p.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// env is what a user of this system sets for the command line.
func (s *cliSystem) env() []string {
	return []string{"LOCKS_API_URL=http://" + s.httpAddr, "LOCKS_API_TOKEN=" + s.token,
		"LOCKS_AMQP_URL=" + s.rabbit.URL, "LOCKS_AMQP_QUEUE=" + s.rabbit.Queue}
}

// cliResult is what a command printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cliEnv is the environment of a command-line process: this process's, without any LOCKS_
// setting of the machine, plus env.
func cliEnv(env []string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "LOCKS_") || strings.HasPrefix(e, "LOCKS_TEST_") {
			out = append(out, e)
		}
	}
	return append(append(out, "LOCKS_TEST_MAIN=1"), env...)
}

// locksCLI runs the locks binary (this test binary) with args and env, as a user would.
func locksCLI(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = cliEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("locks %v: %v", args, err)
	}
	return r
}

// expect runs locks with args and fails t unless it exits with code and its stdout (code 0)
// or stderr (otherwise) holds each of want.
func expect(t *testing.T, env []string, code int, want []string, args ...string) cliResult {
	t.Helper()
	r := locksCLI(t, env, args...)
	out := r.stdout
	if code != 0 {
		out = r.stderr
	}
	if r.code != code {
		t.Fatalf("locks %s: want exit %d; %s", strings.Join(args, " "), code, r)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Fatalf("locks %s: want %q in its output; %s", strings.Join(args, " "), w, r)
		}
	}
	return r
}

// A `locks run` whose gRPC address is taken exits naming LOCKS_GRPC_ADDR, without answering
// /readyz with 200 first: an orchestrator must not take a process about to exit as ready.
func TestTakenGRPCAddressIsNeverReady(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	chDB := testenv.Name("locks_cli")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	httpAddr := testenv.FreeAddr(t)
	cmd := locksCmd(t, []string{
		"LOCKS_POSTGRES_URL=" + testenv.PostgresURL(t),
		"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
		"LOCKS_API_TOKENS=cli-token-0123456789abcdef",
		"LOCKS_HTTP_ADDR=" + httpAddr,
		"LOCKS_GRPC_ADDR=" + taken.Addr().String(),
	}, "run", "--targets=api")
	log := &testenv.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case err := <-exited:
			if err == nil || !strings.Contains(log.String(), "LOCKS_GRPC_ADDR="+taken.Addr().String()) {
				t.Fatalf("exit %v, want an error naming LOCKS_GRPC_ADDR; log:\n%s", err, log)
			}
			return
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("locks run still running 60 s after its gRPC address was found taken; log:\n%s", log)
		default:
		}
		if resp, err := http.Get("http://" + httpAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				_ = cmd.Process.Kill()
				t.Fatalf("/readyz answered 200 with the gRPC address taken; log:\n%s", log)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}
