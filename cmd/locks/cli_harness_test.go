package main

import (
	"bytes"
	"errors"
	"fmt"
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
}

// startCLISystem starts the system with env added to its environment and waits until it is
// ready; it is stopped with SIGTERM when t ends.
func startCLISystem(t *testing.T, env ...string) *cliSystem {
	t.Helper()
	chDB := testenv.Name("locks_cli")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	s := &cliSystem{httpAddr: testenv.FreeAddr(t), token: "cli-token-0123456789abcdef", rabbit: testenv.RabbitMQ(t), log: &testenv.LogBuffer{}}
	cmd := locksCmd(t, append([]string{
		"LOCKS_POSTGRES_URL=" + testenv.PostgresURL(t),
		"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
		"LOCKS_AMQP_URL=" + s.rabbit.URL,
		"LOCKS_AMQP_QUEUE=" + s.rabbit.Queue,
		"LOCKS_HTTP_ADDR=" + s.httpAddr,
		"LOCKS_GRPC_ADDR=" + testenv.FreeAddr(t),
		"LOCKS_API_TOKENS=" + s.token,
		"LOCKS_PARTITIONS=2",
	}, env...), "run", "--targets=all")
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("locks run did not stop within 20 s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("locks run's log:\n%s", s.log)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + s.httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("locks run exited before it was ready; log:\n%s", s.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 60 s; log:\n%s", s.log)
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
