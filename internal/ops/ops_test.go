package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// /readyz answers 503 naming each failing check, and 200 once every check passes;
// /healthz and /metrics answer regardless.
func TestReadyzNamesWhatIsNotReady(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	s := ops.New("127.0.0.1:0", reg, testenv.Logger(t))
	broken := errors.New("postgres: connection refused")
	var pgDown atomic.Bool
	pgDown.Store(true)
	s.AddCheck("postgres", func(context.Context) error {
		if pgDown.Load() {
			return broken
		}
		return nil
	})
	s.AddCheck("nats", func(context.Context) error { return nil })
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	code, body := get("/readyz")
	var r struct {
		Ready  bool              `json:"ready"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusServiceUnavailable || r.Ready || r.Checks["postgres"] != ops.Unavailable || r.Checks["nats"] != "ok" {
		t.Fatalf("readyz with postgres down: %d %s", code, body)
	}
	pgDown.Store(false)
	// /readyz answers from a round of checks at most ReadyEveryDefault old.
	testenv.Eventually(t, 5*time.Second, "readyz 200 with everything up", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, "locks_test_total 1") {
		t.Fatalf("metrics: %d %s", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return within 10 s of cancel")
	}
}
