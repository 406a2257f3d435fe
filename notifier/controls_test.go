package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/internal/webhookctl"
)

// controls are the operator's controls on a NATS connection of their own (as the API's).
func (e *env) controls() *Controls {
	e.t.Helper()
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	return NewControls(ControlsDeps{PG: e.pool, NC: nc})
}

// startOwnConn runs a notifier of e.cfg on a NATS connection of its own, as another process.
func (e *env) startOwnConn() (*Notifier, *prometheus.Registry) {
	e.t.Helper()
	nc, err := nats.Connect(e.nats.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := e.cfg
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	n, err := New(cfg, Deps{JS: js, PG: e.pool, Logger: testenv.Logger(e.t).With("t", e.t.Name()), Registerer: reg})
	if err != nil {
		e.t.Fatal(err)
	}
	testenv.RunPart(e.t, "notifier", n.Run, 20*time.Second)
	return n, reg
}

// brokenReceiver answers status until broken is set to false, then 200.
func brokenReceiver(t *testing.T, status int) (*receiver, *atomic.Bool) {
	broken := &atomic.Bool{}
	broken.Store(true)
	rc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) int {
		if broken.Load() {
			return status
		}
		return http.StatusOK
	})
	return rc, broken
}

func (e *env) disabled(client string) (at *time.Time, reason *string) {
	e.t.Helper()
	if err := e.pool.QueryRow(e.t.Context(), `SELECT disabled_at, disabled_reason FROM clients WHERE id = $1`, client).Scan(&at, &reason); err != nil {
		e.t.Fatal(err)
	}
	return at, reason
}

func (e *env) countRows(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestAutoDisableWaitsAndReenable: an endpoint failing without a 2xx for DisableAfter is
// disabled; events that come meanwhile wait, pending and unattempted; the re-enable sends
// them, in revision order per sensor, and the older revision that had failed stays superseded.
func TestAutoDisableWaitsAndReenable(t *testing.T) {
	t.Parallel()
	sched := make([]time.Duration, 40)
	for i := range sched {
		sched[i] = 100 * time.Millisecond
	}
	e := newEnv(t, sched...)
	rc, broken := brokenReceiver(t, http.StatusBadGateway)
	e.client("c1", rc.URL)
	e.sensor("s1", "a")
	e.sensor("s2", "b")
	e.subscribe("c1", "s1")
	e.subscribe("c1", "s2")
	e.cfg.DisableAfter = 700 * time.Millisecond
	e.start()
	e.publish(testEvent("s1", 1, 1))

	testenv.Eventually(t, 15*time.Second, "c1 disabled", func() bool { at, _ := e.disabled("c1"); return at != nil })
	_, reason := e.disabled("c1")
	t.Logf("disabled: %s", *reason)
	if reason == nil || !containsRaw([]byte(*reason), "HTTP 502") {
		t.Errorf("reason %v does not name the last failure", reason)
	}
	e.publish(testEvent("s1", 2, 0), testEvent("s2", 1, 1))
	testenv.Eventually(t, 10*time.Second, "the new events ingested", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE client_id = 'c1'`) == 3
	})
	// Nothing goes out while disabled (an attempt under way at the disable may still end).
	time.Sleep(500 * time.Millisecond)
	before := rc.count()
	time.Sleep(time.Second)
	if got := rc.count(); got != before {
		t.Fatalf("the receiver got %d requests while the endpoint was disabled", got-before)
	}
	if n := e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE client_id = 'c1' AND state = 'pending' AND attempts = 0`); n != 2 {
		t.Fatalf("%d unattempted pending deliveries, want 2 (s1 rev 2, s2 rev 1)", n)
	}
	if n := e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE client_id = 'c1' AND event_id = $1 AND state = 'superseded'`, event.ID("s1", 1)); n != 1 {
		t.Fatalf("s1 rev 1 (failed, then a newer revision came) is not superseded")
	}

	broken.Store(false)
	was, err := e.controls().Enable(t.Context(), "c1")
	if err != nil || !was {
		t.Fatalf("enable: %v, was disabled %v", err, was)
	}
	testenv.Eventually(t, 10*time.Second, "both waiting deliveries delivered", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE client_id = 'c1' AND state = 'delivered'`) == 2
	})
	if at, _ := e.disabled("c1"); at != nil {
		t.Errorf("still disabled after the re-enable")
	}
	var revs []int64
	for _, h := range rc.got() {
		if h.status == http.StatusOK {
			revs = append(revs, bodyOf(t, h).Revision)
		}
	}
	if len(revs) != 2 {
		t.Errorf("delivered revisions %v, want s1 rev 2 and s2 rev 1", revs)
	}
}

// TestEventTypeFilters: a client that chose only connection events gets no state change,
// and a subscription's own filter narrows what its client gets from that sensor.
func TestEventTypeFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.client("conn", rc.URL+"/?c=conn")
	e.client("state", rc.URL+"/?c=state")
	e.exec(`UPDATE clients SET event_types = '{sensor.connection_lost,sensor.connection_restored}' WHERE id = 'conn'`)
	e.sensor("s1", "a")
	e.subscribe("conn", "s1")
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id, event_types) VALUES ('state', 's1', '{sensor.state_changed}')`)
	e.start()
	changed, lost, restored := testEvent("s1", 1, 1), testEvent("s1", 2, 1), testEvent("s1", 3, 1)
	lost.Type, restored.Type = event.TypeConnectionLost, event.TypeConnectionRestored
	e.publish(changed, lost, restored)
	testenv.Eventually(t, 10*time.Second, "3 webhooks", func() bool { return rc.count() >= 3 })
	time.Sleep(300 * time.Millisecond)
	got := map[string][]string{}
	for _, h := range rc.got() {
		c := "conn"
		if h.header.Get("webhook-id") == changed.ID {
			c = "state"
		}
		got[c] = append(got[c], bodyOf(t, h).Type)
	}
	if fmt.Sprint(got) != "map[conn:[sensor.connection_lost sensor.connection_restored] state:[sensor.state_changed]]" {
		t.Fatalf("webhooks %v", got)
	}
	if n := e.countRows(`SELECT count(*) FROM notifier_deliveries`); n != 3 {
		t.Fatalf("%d delivery rows, want 3 (filtered events make none)", n)
	}
}

// TestResetReachesEveryNotifier: two notifier processes on one NATS both opened a client's
// breaker (a minute's cooldown); the receiver is fixed and the dead deliveries redriven with
// a reset: it reaches both, and the deliveries arrive without waiting out the cooldown.
func TestResetReachesEveryNotifier(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // one attempt: a failure is dead at once
	rc, broken := brokenReceiver(t, http.StatusInternalServerError)
	e.client("c1", rc.URL)
	e.cfg.BreakerThreshold, e.cfg.BreakerCooldown, e.cfg.BreakerMaxCooldown = 1, time.Minute, time.Minute
	n1, _ := e.startOwnConn()
	n2, _ := e.startOwnConn()
	for i := 1; !(n1.ep.open("c1") && n2.ep.open("c1")); i++ {
		if i > 40 {
			t.Fatal("the two notifiers did not both open c1's breaker")
		}
		s := fmt.Sprintf("s%d", i)
		e.sensor(s, "a")
		e.subscribe("c1", s)
		e.publish(testEvent(s, 1, 1))
		want := i
		testenv.Eventually(t, 10*time.Second, "the event dead", func() bool {
			return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'dead'`) == want
		})
	}
	dead := e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'dead'`)
	broken.Store(false)
	redriven, err := NewDeadLetters(DeadLettersDeps{PG: e.pool}).Redrive(t.Context(), "c1", time.Time{}, time.Time{})
	if err != nil || int(redriven) != dead {
		t.Fatalf("redrive: %d, %v; want %d", redriven, err, dead)
	}
	start := time.Now()
	if err := e.controls().Reset(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
	// A correctness bound, not a benchmark: without the reset they wait the minute's cooldown.
	testenv.Eventually(t, 2*time.Second, "the redriven deliveries delivered", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == dead
	})
	t.Logf("%d redriven deliveries delivered %s after the reset", dead, time.Since(start))
	if n1.ep.open("c1") || n2.ep.open("c1") {
		t.Errorf("a breaker is still open: first %v, second %v", n1.ep.open("c1"), n2.ep.open("c1"))
	}
}

// TestResendAndTestEvent: a dead delivery is resent and arrives under its webhook-id; a
// delivery superseded by a newer event of its sensor is refused; a test event is signed as
// usual and recorded in the client's attempts.
func TestResendAndTestEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc, broken := brokenReceiver(t, http.StatusInternalServerError)
	secret := e.client("c1", rc.URL)
	e.sensor("s1", "a")
	e.sensor("s2", "b")
	e.subscribe("c1", "s1")
	e.subscribe("c1", "s2")
	e.start()
	ctl := e.controls()
	e.publish(testEvent("s1", 1, 1), testEvent("s2", 1, 1))
	testenv.Eventually(t, 10*time.Second, "both dead", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'dead'`) == 2
	})
	broken.Store(false)
	e.publish(testEvent("s2", 2, 0))
	testenv.Eventually(t, 10*time.Second, "s2 rev 2 delivered", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == 1
	})
	if err := ctl.Resend(t.Context(), "c1", event.ID("s2", 1)); !errors.Is(err, webhookctl.ErrSuperseded) {
		t.Fatalf("resend of a superseded revision: %v, want ErrSuperseded", err)
	}
	if err := ctl.Resend(t.Context(), "c1", "evt_nope"); !errors.Is(err, webhookctl.ErrNoDelivery) {
		t.Fatalf("resend of no delivery: %v", err)
	}
	if err := ctl.Resend(t.Context(), "c1", event.ID("s1", 1)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "s1 rev 1 delivered", func() bool {
		return e.countRows(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == 2
	})
	id, err := ctl.SendTest(t.Context(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	var test *hit
	testenv.Eventually(t, 10*time.Second, "the test event", func() bool {
		for _, h := range rc.got() {
			if h.header.Get("webhook-id") == id {
				test = &h
				return true
			}
		}
		return false
	})
	verify(t, *test, secret)
	if b := bodyOf(t, *test); b.ID != id || b.Type != webhookctl.TypeTest {
		t.Errorf("test body %s", test.body)
	}
	testenv.Eventually(t, 10*time.Second, "the test attempt recorded", func() bool {
		for _, a := range e.records("c1") {
			if a.EventID == id && a.Outcome == event.OutcomeDelivered {
				return true
			}
		}
		return false
	})
}

// TestClientMetricsBounded: past MetricsMaxClients, clients are counted under client="other".
func TestClientMetricsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.sensor("s1", "a")
	for _, c := range []string{"c1", "c2", "c3"} {
		e.client(c, rc.URL)
		e.subscribe(c, "s1")
	}
	e.cfg.MetricsMaxClients = 1
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 10*time.Second, "3 webhooks", func() bool { return rc.count() == 3 })
	testenv.Eventually(t, 5*time.Second, "3 delivered in the metrics", func() bool {
		return metricValue(t, e, "locks_notifier_attempts_total", "outcome", "delivered") == 3
	})
	own, other := 0.0, metricValue(t, e, "locks_notifier_client_attempts_total", "client", "other")
	for _, c := range []string{"c1", "c2", "c3"} {
		own += metricValue(t, e, "locks_notifier_client_attempts_total", "client", c)
	}
	if own != 1 || other != 2 {
		t.Fatalf("per-client series: %v for own labels, %v under other; want 1 and 2", own, other)
	}
}
