package notifier

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A receiver that answers with 1 MiB of headers fails the attempt once the client has read
// 64 KiB of them (net/http alone would read 10 MB per attempt): the attempt is a retry,
// counted as such, and the next one, with normal headers, delivers.
func TestHugeResponseHeadersFailTheAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond, 400*time.Millisecond)
	filler := strings.Repeat("x", 1000)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			for i := range 1024 {
				w.Header().Set("X-Filler-"+string(rune('a'+i%26))+strings.Repeat("y", i/26), filler)
			}
			return http.StatusOK
		}
		return http.StatusNoContent
	})
	e.client("c1", rc.URL)
	e.sensor("s1", "a")
	e.subscribe("c1", "s1")
	e.start()
	e.publish(testEvent("s1", 1, 1))

	testenv.Eventually(t, 15*time.Second, "a delivered attempt", func() bool {
		return strings.Contains(outcomes(e.records("c1")), "delivered")
	})
	recs := e.records("c1")
	if got := outcomes(recs); got != "1:retry,2:delivered" {
		t.Fatalf("attempt records %s, want 1:retry,2:delivered (%+v)", got, recs)
	}
	if !strings.Contains(recs[0].Error, "header") || recs[0].StatusCode != 0 {
		t.Errorf("first attempt: status %d, error %q; want a transport error about the headers", recs[0].StatusCode, recs[0].Error)
	}
	for outcome, want := range map[string]float64{"retry": 1, "delivered": 1} {
		if got := metricValue(t, e, "locks_notifier_attempts_total", "outcome", outcome); got != want {
			t.Errorf("locks_notifier_attempts_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

// A receiver's token in its URL's query string (and a password in its user info) appears
// neither in the attempt errors stored in DELIVERIES (shown in the delivery history) nor in
// the log lines that carry them.
func TestWebhookURLSecretsStayOutOfErrorsAndLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) int {
		if n <= 3 {
			// Drop the connection without an answer: net/http's error names the URL.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return 0
		}
		return http.StatusNoContent
	})
	const secret = "hunter2-receiver-token"
	url := strings.Replace(rc.URL, "http://", "http://user:"+secret+"-pw@", 1) + "/hook?token=" + secret
	e.client("c1", url)
	e.sensor("s1", "a")
	e.subscribe("c1", "s1")
	log, logs := testenv.CaptureLogger()
	cfg := e.cfg
	cfg.PollInterval, cfg.BreakerThreshold, cfg.BreakerCooldown = 100*time.Millisecond, 2, 100*time.Millisecond
	n, err := New(cfg, Deps{JS: e.nats.JS, PG: e.pool, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "notifier", n.Run, 20*time.Second)
	e.publish(testEvent("s1", 1, 1))

	testenv.Eventually(t, 15*time.Second, "4 attempt records", func() bool { return len(e.records("c1")) >= 4 })
	recs := e.records("c1")
	if got := outcomes(recs); got != "1:retry,2:retry,3:retry,4:delivered" {
		t.Fatalf("attempt records %s", got)
	}
	for _, r := range recs[:3] {
		if !strings.Contains(r.Error, "/hook") || strings.Contains(r.Error, secret) {
			t.Errorf("attempt %d error %q: want the URL's path without %q", r.Attempt, r.Error, secret)
		}
	}
	if got := logs.String(); !strings.Contains(got, "circuit opened") || strings.Contains(got, secret) {
		t.Errorf("logs name the breaker: %v; contain the secret: %v\n%s", strings.Contains(got, "circuit opened"), strings.Contains(got, secret), got)
	}
}
