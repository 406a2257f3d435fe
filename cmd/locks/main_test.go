package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The test binary doubles as the locks binary: with LOCKS_TEST_MAIN=1 it runs main, so the
// tests can start real processes, signal them and read their exit codes.
func TestMain(m *testing.M) {
	if os.Getenv("LOCKS_TEST_MAIN") == "1" {
		main()
		return
	}
	// The tests mostly wait: on processes starting and stopping, on refused requests.
	testenv.Main(m, 8)
}

func locksCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// Tests run several systems at once: each embedded NATS on a free port.
	cmd.Env = append(append(os.Environ(), "LOCKS_TEST_MAIN=1", "LOCKS_DATA_DIR="+t.TempDir(), "LOCKS_NATS_LISTEN=127.0.0.1:0"), env...)
	return cmd
}

func TestBadConfigurationExits2NamingTheVariable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"LOCKS_LOST_AFTER=abc"}, []string{"run"}, "LOCKS_LOST_AFTER"},
		{nil, []string{"run", "--lost-after=-1s"}, "--lost-after"},
		{nil, []string{"run", "--targets=bridge,nope"}, "--targets"},
		{nil, []string{"run", "--partitions=99"}, "--partitions"},
		{[]string{"LOCKS_PARTITIONS=x"}, []string{"migrate"}, "LOCKS_PARTITIONS"},
		{nil, []string{"frobnicate"}, "unknown command"},
	}
	for _, c := range cases {
		t.Run(strings.Join(append(c.env, c.args...), " "), func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			getenv := func(k string) string {
				for _, e := range c.env {
					if name, v, _ := strings.Cut(e, "="); name == k {
						return v
					}
				}
				return ""
			}
			code := run(c.args, getenv, &bytes.Buffer{}, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and a line naming %s", code, stderr.String(), c.want)
			}
		})
	}
}

func TestUnreachablePostgresFailsFastNamingTheVariable(t *testing.T) {
	t.Parallel()
	cmd := locksCmd(t, []string{"LOCKS_POSTGRES_URL=postgres://nobody@127.0.0.1:1/x", "LOCKS_HTTP_ADDR=" + testenv.FreeAddr(t)}, "run")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("locks run exited 0 with an unreachable Postgres")
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("locks run did not exit within 15 s with an unreachable Postgres")
	}
	last := lastLine(stderr.String())
	if !strings.Contains(last, "LOCKS_POSTGRES_URL") || !strings.Contains(last, "connection refused") {
		t.Fatalf("last line %q should name LOCKS_POSTGRES_URL and the cause", last)
	}
	t.Logf("exited after %s: %s", time.Since(start).Round(time.Millisecond), last)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// The whole system starts against the real servers, becomes ready (on /readyz and on
// grpc.health.v1, which needs no token), logs JSON lines, exports a reading's span to the
// OTLP endpoint of OTEL_EXPORTER_OTLP_ENDPOINT, and stops cleanly on SIGTERM.
func TestRunBecomesReadyAndStopsOnSignal(t *testing.T) {
	t.Parallel()
	pgURL := testenv.PostgresURL(t)
	chDB := testenv.Name("locks_run")
	t.Cleanup(func() { testenv.DropClickHouseDatabase(t, chDB) })
	http1, grpc1 := testenv.FreeAddr(t), testenv.FreeAddr(t)
	rabbit := testenv.RabbitMQ(t)
	otlp := testenv.OTLP(t)
	cmd := locksCmd(t, []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.URL,
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"LOCKS_POSTGRES_URL=" + pgURL,
		"LOCKS_CLICKHOUSE_URL=clickhouse://" + testenv.ClickHouseAddr() + "/" + chDB,
		"LOCKS_AMQP_URL=" + rabbit.URL,
		"LOCKS_AMQP_QUEUE=" + rabbit.Queue,
		"LOCKS_HTTP_ADDR=" + http1,
		"LOCKS_GRPC_ADDR=" + grpc1,
		"LOCKS_API_TOKENS=test-token-0123456789",
		"LOCKS_PARTITIONS=4",
		"LOCKS_LOG_FORMAT=json",
	}, "run", "--targets=all")
	// As systemd runs a Type=notify unit (deploy/systemd): the states arrive on NOTIFY_SOCKET.
	sock := filepath.Join(t.TempDir(), "notify")
	notifyConn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { notifyConn.Close() })
	states := make(chan string, 8)
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := notifyConn.Read(buf)
			if err != nil {
				return
			}
			states <- string(buf[:n])
		}
	}()
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	select {
	case s := <-states:
		if s != "READY=1" {
			t.Fatalf("first sd_notify state %q, want READY=1", s)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no READY=1 on NOTIFY_SOCKET within 60 s; log:\n%s", stderr.String())
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + http1 + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 60 s (last: %v %v); log:\n%s", resp, err, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := http.Get("http://" + http1 + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	conn, err := grpc.NewClient(grpc1, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", "locks.v1.ClientService", "locks.v1.HistoryService"} {
		testenv.Eventually(t, 30*time.Second, "grpc.health.v1 SERVING for "+service, func() bool {
			res, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
			return err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}
	if _, err := locksv1.NewSensorServiceClient(conn).ListSensors(t.Context(), &locksv1.ListSensorsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListSensors without a token: %v, want UNAUTHENTICATED", err)
	}
	// Ready does not wait for the bridge's first session, which declares the queue: until
	// then locks publish rightly refuses (NO_ROUTE), so it is tried again for a while.
	testenv.Eventually(t, 10*time.Second, "locks publish to the bridge's queue", func() bool {
		pub := locksCmd(t, []string{"LOCKS_AMQP_URL=" + rabbit.URL, "LOCKS_AMQP_QUEUE=" + rabbit.Queue}, "publish", "door7", "1")
		out, perr := pub.CombinedOutput()
		if perr != nil {
			t.Logf("locks publish: %v: %s", perr, out)
		}
		return perr == nil
	})
	var appendSpan string
	testenv.Eventually(t, 10*time.Second, "the reading's bridge.append span at the OTLP receiver", func() bool {
		for _, s := range otlp.Named("bridge.append") {
			if s.Attrs["sensor.id"] == "door7" && s.Service == "lock-sensors" {
				appendSpan = s.TraceID + "/" + s.SpanID
				return true
			}
		}
		return false
	})
	testenv.Eventually(t, 10*time.Second, "a state.apply span linked to the reading's", func() bool {
		for _, s := range otlp.Named("state.apply") {
			if slices.Contains(s.Links, appendSpan) {
				return true
			}
		}
		return false
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("locks run exited with %v after SIGTERM; log:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("locks run did not stop within 20 s of SIGTERM; log:\n%s", stderr.String())
	}
	select {
	case s := <-states:
		if s != "STOPPING=1" {
			t.Errorf("sd_notify state after SIGTERM %q, want STOPPING=1", s)
		}
	default:
		t.Error("no STOPPING=1 on NOTIFY_SOCKET after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "stopped cleanly") {
		t.Fatalf("no clean stop in the log:\n%s", stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["time"] == nil || rec["level"] == nil || rec["msg"] == nil {
			t.Errorf("LOCKS_LOG_FORMAT=json wrote a line that is not a JSON record with time, level, msg: %q", line)
		}
	}
	// Nothing of ours still listens.
	if c, err := net.DialTimeout("tcp", http1, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after exit", http1)
	}
}
