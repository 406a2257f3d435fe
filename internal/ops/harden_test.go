package ops_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/redact"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/migrations"
)

func serve(t *testing.T, s *ops.Server) string {
	t.Helper()
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "ops", func(ctx context.Context) error { return s.Serve(ctx, ln) }, 10*time.Second)
	return "http://" + ln.Addr().String()
}

// With Postgres unreachable (a real pool on a port nothing listens on), /readyz without a
// token names "postgres" but not the driver's error text, which names the host, port and
// user; a request the details function accepts gets the text; the log gets it once; an
// error marked Public is shown to all.
func TestReadyzHidesErrorTextWithoutToken(t *testing.T) {
	t.Parallel()
	free := testenv.FreeAddr(t)
	pool, err := pgxpool.New(t.Context(), "postgres://secretuser:hunter2@"+free+"/locks?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	check := func(ctx context.Context) error { return migrations.PostgresReady(ctx, pool) }
	raw := check(t.Context())
	if raw == nil || !strings.Contains(raw.Error(), "secretuser") {
		t.Fatalf("the down Postgres's error %v does not name its user; the test needs a telling error", raw)
	}
	log, logs := testenv.CaptureLogger()
	s := ops.New("127.0.0.1:0", prometheus.NewRegistry(), log)
	s.AddCheck("postgres", check)
	s.AddCheck("store", func(context.Context) error {
		return redact.Public(errors.New("READINGS partition 3 is behind the state checkpoint; restore the store or run locks replay"))
	})
	s.ShowDetailsTo(func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer right" })
	base := serve(t, s)

	get := func(auth string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/readyz", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		code, body := get(auth)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"postgres":"unavailable"`) {
			t.Errorf("authorization %q: %d %s, want 503 naming postgres as unavailable", auth, code, body)
		}
		for _, secret := range []string{raw.Error(), "secretuser", free} {
			if strings.Contains(body, secret) {
				t.Errorf("authorization %q: body %s shows %q", auth, body, secret)
			}
		}
		if !strings.Contains(body, "restore the store") {
			t.Errorf("authorization %q: body %s hides the Public reason", auth, body)
		}
	}
	if code, body := get("Bearer right"); code != http.StatusServiceUnavailable || !strings.Contains(body, "secretuser") {
		t.Errorf("with the token: %d %s, want the error text", code, body)
	}
	if n := strings.Count(logs.String(), "readiness check fails\" check=postgres"); n != 1 {
		t.Errorf("the failing check was logged %d times over three polls, want once:\n%s", n, logs.String())
	}
}

// A client that stops sending its body, and a kept-alive connection left idle, are
// closed by the server instead of being held for ever.
func TestServerClosesSlowAndIdleConnections(t *testing.T) {
	t.Parallel()
	s := ops.New("127.0.0.1:0", prometheus.NewRegistry(), testenv.Logger(t))
	s.SetTimeouts(ops.Timeouts{ReadHeader: 5 * time.Second, Read: 300 * time.Millisecond, Idle: 300 * time.Millisecond})
	s.Handle("POST /echo", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusRequestTimeout)
			return
		}
		_, _ = w.Write(b)
	}))
	addr := strings.TrimPrefix(serve(t, s), "http://")

	// closed reports whether the server closed conn (EOF, after any answer) before the
	// test's own deadline.
	closed := func(conn net.Conn) error {
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("still open after 15 s")
		}
		return nil
	}

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nonly ten b"); err != nil {
		t.Fatal(err)
	}
	if err := closed(slow); err != nil {
		t.Errorf("a request whose body stalls: %v", err)
	}

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || res.StatusCode != http.StatusOK || res.Close {
		t.Fatalf("healthz on a kept-alive connection: %v %v", res, err)
	}
	_ = res.Body.Close()
	if err := closed(idle); err != nil {
		t.Errorf("an idle kept-alive connection: %v", err)
	}
}

// A request whose header exceeds MaxHeaderBytes is refused with 431 before any handler
// runs; one just under it is served.
func TestHeaderBytesCapped(t *testing.T) {
	t.Parallel()
	base := serve(t, ops.New("127.0.0.1:0", prometheus.NewRegistry(), testenv.Logger(t)))
	for _, tc := range []struct {
		size int
		want int
	}{{ops.MaxHeaderBytes / 2, http.StatusOK}, {ops.MaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/healthz", nil)
		req.Header.Set("X-Filler", strings.Repeat("a", tc.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("a %d-byte header: %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}
