package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// locks healthcheck asks the process at LOCKS_HTTP_ADDR (0.0.0.0 as loopback): 0 when ready,
// 1 when not ready or not listening, 2 on bad usage.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	ready := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
		case r.URL.Path == "/readyz" && ready:
		default:
			http.Error(w, "nats: connection closed", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	env := func(addr string) func(string) string {
		return func(k string) string {
			if k == "LOCKS_HTTP_ADDR" {
				return addr
			}
			return ""
		}
	}
	check := func(addr string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"healthcheck"}, args...), env(addr), &out, &errb)
		return code, errb.String()
	}
	if code, msg := check("0.0.0.0:" + port); code != 0 {
		t.Fatalf("ready: exit %d: %s", code, msg)
	}
	ready = false
	if code, msg := check("0.0.0.0:" + port); code != 1 || !bytes.Contains([]byte(msg), []byte("503")) {
		t.Fatalf("not ready: exit %d: %s, want 1 with the status", code, msg)
	}
	if code, msg := check("127.0.0.1:"+port, "--path=/healthz"); code != 0 {
		t.Fatalf("alive: exit %d: %s", code, msg)
	}
	closed := testenv.FreeAddr(t) // reserved: nothing listens on it
	if code, _ := check(closed); code != 1 {
		t.Fatalf("nothing listening: exit %d, want 1", code)
	}
	if code, _ := check("no-port"); code != 2 {
		t.Fatalf("bad LOCKS_HTTP_ADDR: exit %d, want 2", code)
	}
}
