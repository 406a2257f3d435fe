package notifier

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestRetryThenSuccess: a receiver failing twice then succeeding gets the same webhook-id
// each time, the gaps grow per the schedule, the signature and body follow the contract.
func TestRetryThenSuccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond, 400*time.Millisecond, 800*time.Millisecond)
	rc := newReceiver(t, func(n int, _ http.ResponseWriter, _ *http.Request) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	secret := e.client("c1", rc.URL)
	e.sensor("s1", "Moscow, Russia, Svobody st. 23 fl 1 room 16")
	e.subscribe("c1", "s1")
	e.start()
	ev := testEvent("s1", 1, 1)
	e.publish(ev)

	testenv.Eventually(t, 15*time.Second, "3 attempts", func() bool { return rc.count() >= 3 })
	testenv.Eventually(t, 10*time.Second, "3 attempt records", func() bool { return len(e.records("c1")) >= 3 })
	hs := rc.got()
	if len(hs) != 3 {
		t.Fatalf("receiver got %d requests, want 3", len(hs))
	}
	for i, h := range hs {
		if id := h.header.Get("webhook-id"); id != ev.ID {
			t.Errorf("attempt %d: webhook-id %q, want %q", i+1, id, ev.ID)
		}
		if ct := h.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("attempt %d: Content-Type %q", i+1, ct)
		}
		if got := verify(t, h, secret); len(got) != 1 {
			t.Errorf("attempt %d: %d signatures, want 1", i+1, len(got))
		}
		ts := h.header.Get("webhook-timestamp")
		if d := h.at.Unix() - mustInt(t, ts); d < -1 || d > 1 {
			t.Errorf("attempt %d: webhook-timestamp %s is not the attempt's time %d", i+1, ts, h.at.Unix())
		}
		b := bodyOf(t, h)
		if b.ID != ev.ID || b.Type != "sensor.state_changed" || b.Sensor.ID != "s1" ||
			b.Sensor.Address != "Moscow, Russia, Svobody st. 23 fl 1 room 16" || b.Data == nil || *b.Data != 1 ||
			b.PreviousData != nil || b.Revision != 1 || b.OccurredAt != ev.OccurredAt.Format("2006-01-02T15:04:05.000Z") {
			t.Errorf("attempt %d: body %s does not match the event %+v", i+1, h.body, ev)
		}
		if !containsRaw(h.body, `"previous_data":null`) {
			t.Errorf("attempt %d: body %s lacks \"previous_data\":null", i+1, h.body)
		}
	}
	g1, g2 := hs[1].at.Sub(hs[0].at), hs[2].at.Sub(hs[1].at)
	t.Logf("gaps %s, %s", g1, g2)
	// The schedule's steps are lower bounds: an attempt is never early. A gap may run long
	// on a busy machine (another package's tests beside these), so the second need not be
	// longer than the first as measured.
	if g1 < 200*time.Millisecond || g2 < 400*time.Millisecond {
		t.Errorf("gaps %s, %s: want ≥200ms, then ≥400ms", g1, g2)
	}
	if got := outcomes(e.records("c1")); got != "1:retry,2:retry,3:delivered" {
		t.Errorf("attempt records %s", got)
	}
	recs := e.records("c1")
	if recs[0].StatusCode != 500 || recs[2].StatusCode != 204 || recs[0].EventID != ev.ID || recs[0].SensorID != "s1" {
		t.Errorf("records %+v", recs)
	}
	time.Sleep(300 * time.Millisecond)
	if rc.count() != 3 {
		t.Errorf("receiver got %d requests after delivery, want 3", rc.count())
	}
	for outcome, want := range map[string]float64{"retry": 2, "delivered": 1, "dead": 0} {
		if got := metricValue(t, e, "locks_notifier_attempts_total", "outcome", outcome); got != want {
			t.Errorf("locks_notifier_attempts_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	for class, want := range map[string]float64{"5xx": 2, "2xx": 1} {
		if got := metricValue(t, e, "locks_notifier_attempt_duration_seconds", "result", class); got != want {
			t.Errorf("locks_notifier_attempt_duration_seconds{result=%q} count = %v, want %v", class, got, want)
		}
	}
}

// metricValue is a counter's value or a histogram's count, for the series with label=value.
func metricValue(t *testing.T, e *env, name, label, value string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if h := m.GetHistogram(); h != nil {
						return float64(h.GetSampleCount())
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func mustInt(t testing.TB, s string) int64 {
	t.Helper()
	var v int64
	if _, err := fmt.Sscan(s, &v); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

func containsRaw(b []byte, s string) bool {
	return len(b) >= len(s) && (string(b) == s || indexOf(string(b), s) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestRegistryChangesBetweenAttempts: the URL, the subscription and the client are read
// afresh at each attempt.
func TestRegistryChangesBetweenAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(e *env, newURL string)
		// want: requests at the old and at the new receiver, and the last record's outcome.
		old, new int
		last     string
	}{
		{"url changed", func(e *env, u string) { e.exec(`UPDATE clients SET webhook_url = $1 WHERE id = 'c1'`, u) }, 1, 1, event.OutcomeDelivered},
		{"unsubscribed", func(e *env, _ string) { e.exec(`DELETE FROM subscriptions WHERE client_id = 'c1'`) }, 1, 0, event.OutcomeCancelled},
		{"client deleted", func(e *env, _ string) { e.exec(`DELETE FROM clients WHERE id = 'c1'`) }, 1, 0, event.OutcomeCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 700*time.Millisecond, 700*time.Millisecond)
			var changed atomic.Bool
			newRc := newReceiver(t, nil)
			oldRc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) int { return http.StatusBadGateway })
			e.client("c1", oldRc.URL)
			e.sensor("s1", "here")
			e.subscribe("c1", "s1")
			e.start()
			e.publish(testEvent("s1", 1, 0))
			testenv.Eventually(t, 10*time.Second, "first attempt", func() bool { return oldRc.count() >= 1 })
			tc.change(e, newRc.URL)
			changed.Store(true)
			testenv.Eventually(t, 10*time.Second, "the next attempt's record", func() bool { return len(e.records("c1")) >= 2 })
			time.Sleep(1500 * time.Millisecond) // past the remaining schedule: nothing more may come
			recs := e.records("c1")
			if oldRc.count() != tc.old || newRc.count() != tc.new {
				t.Fatalf("old receiver %d requests, new %d; want %d, %d (records %s)", oldRc.count(), newRc.count(), tc.old, tc.new, outcomes(recs))
			}
			if len(recs) != 2 || recs[0].Outcome != event.OutcomeRetry || recs[1].Outcome != tc.last || recs[1].Attempt != 2 {
				t.Fatalf("records %s, want 1:retry,2:%s", outcomes(recs), tc.last)
			}
		})
	}
}

// TestSupersedeWhileDown: events 1, 2, 3 of a sensor while its receiver is down; when it
// is back it gets 3 (or 2 then 3), never an older revision after a newer one.
func TestSupersedeWhileDown(t *testing.T) {
	t.Parallel()
	// Revision 1's retry waits 2 s: on a loaded machine, 2 and 3 are surely taken in (and
	// supersede it) first, which is what the test is about.
	e := newEnv(t, 2*time.Second, 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond)
	var up atomic.Bool
	rc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 10*time.Second, "first attempt", func() bool { return rc.count() >= 1 })
	e.publish(testEvent("s1", 2, 0))
	e.publish(testEvent("s1", 3, 1))
	time.Sleep(200 * time.Millisecond)
	up.Store(true)
	testenv.Eventually(t, 15*time.Second, "revision 3 delivered", func() bool {
		for _, h := range rc.got() {
			if h.status == http.StatusOK && bodyOf(t, h).Revision == 3 {
				return true
			}
		}
		return false
	})
	time.Sleep(800 * time.Millisecond)
	var revs []int64
	for _, h := range rc.got() {
		revs = append(revs, bodyOf(t, h).Revision)
	}
	t.Logf("revisions received in order: %v", revs)
	for i := 1; i < len(revs); i++ {
		if revs[i] < revs[i-1] {
			t.Fatalf("revision %d arrived after %d: %v", revs[i], revs[i-1], revs)
		}
	}
	if revs[len(revs)-1] != 3 {
		t.Fatalf("last revision %d, want 3", revs[len(revs)-1])
	}
	var n int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE state = 'pending'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("pending rows %d (%v), want 0", n, err)
	}
	var sup int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE state = 'superseded'`).Scan(&sup); err != nil || sup < 1 {
		t.Fatalf("superseded rows %d (%v), want at least 1", sup, err)
	}
}

// TestRotationSignsWithBoth: during a rotation both secrets sign; after it only the new one.
func TestRotationSignsWithBoth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		until time.Duration
		want  []int
	}{
		{"during the overlap", time.Hour, []int{0, 1}},
		{"after the overlap", -time.Minute, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			rc := newReceiver(t, nil)
			secret := e.client("c1", rc.URL)
			previous := "whsec_" + "b2xkLXNlY3JldC1vZi1jMS0wMTIzNDU2Nzg5"
			e.exec(`UPDATE clients SET previous_secret = $1, previous_secret_until = now() + $2 * interval '1 second'`, previous, tc.until.Seconds())
			e.sensor("s1", "here")
			e.subscribe("c1", "s1")
			e.start()
			e.publish(testEvent("s1", 1, 1))
			testenv.Eventually(t, 10*time.Second, "delivery", func() bool { return rc.count() >= 1 })
			got := verify(t, rc.got()[0], secret, previous)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("signatures matched secrets %v, want %v (header %q)", got, tc.want, rc.got()[0].header.Get("webhook-signature"))
			}
		})
	}
}

// TestDeadAndRedrive: after the last attempt a delivery is dead and listed; a redrive sends
// it again with a fresh schedule, and never an older revision after a newer one.
func TestDeadAndRedrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 100*time.Millisecond)
	var up atomic.Bool
	rc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) int {
		if up.Load() {
			return http.StatusOK
		}
		return http.StatusGone
	})
	e.client("c1", rc.URL)
	e.sensor("s1", "here")
	e.sensor("s2", "there")
	e.subscribe("c1", "s1")
	e.subscribe("c1", "s2")
	e.cfg.BreakerThreshold = 100
	e.start()
	e.publish(testEvent("s1", 1, 1), testEvent("s2", 1, 1))
	testenv.Eventually(t, 10*time.Second, "two dead deliveries", func() bool {
		d, err := NewDeadLetters(DeadLettersDeps{PG: e.pool}).ListDead(t.Context(), "c1", 0, 10)
		return err == nil && len(d) == 2
	})
	// s2 has a newer event meanwhile (delivered while the receiver is up): its dead revision 1
	// must not be redriven.
	up.Store(true)
	e.publish(testEvent("s2", 2, 0))
	testenv.Eventually(t, 10*time.Second, "s2 revision 2", func() bool { return rc.count() >= 5 })
	dead, err := NewDeadLetters(DeadLettersDeps{PG: e.pool}).ListDead(t.Context(), "c1", 0, 10)
	if err != nil || len(dead) != 2 || dead[0].Attempts != 2 || dead[0].LastStatus != http.StatusGone || dead[0].Event.ID == "" {
		t.Fatalf("dead %+v, err %v", dead, err)
	}
	n, err := NewDeadLetters(DeadLettersDeps{PG: e.pool}).Redrive(t.Context(), "c1", time.Now().Add(-time.Hour), time.Now().Add(time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v; want 1 (s1 only)", n, err)
	}
	testenv.Eventually(t, 10*time.Second, "the redriven delivery", func() bool { return rc.count() >= 6 })
	time.Sleep(500 * time.Millisecond)
	hs := rc.got()
	if len(hs) != 6 {
		t.Fatalf("receiver got %d requests, want 6", len(hs))
	}
	if b := bodyOf(t, hs[5]); b.Sensor.ID != "s1" || b.Revision != 1 {
		t.Fatalf("redriven %s, want s1 revision 1", hs[5].body)
	}
	testenv.Eventually(t, 10*time.Second, "records", func() bool {
		for _, a := range e.records("c1") {
			if a.SensorID == "s1" && a.Attempt == 3 && a.Outcome == event.OutcomeDelivered {
				return true
			}
		}
		return false
	})
	if d, _ := NewDeadLetters(DeadLettersDeps{PG: e.pool}).ListDead(t.Context(), "c1", 0, 10); len(d) != 0 {
		t.Fatalf("still dead after redrive: %+v", d)
	}
}

// TestHangingReceiverIsolation: one client's receiver hangs with 1,000 events pending for
// it; another client's delivery still arrives within 1 s.
func TestHangingReceiverIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	e.cfg.WebhookTimeout = 10 * time.Second
	hang := newReceiver(t, func(_ int, _ http.ResponseWriter, r *http.Request) int { <-r.Context().Done(); return 0 })
	fast := newReceiver(t, nil)
	e.client("hang", hang.URL)
	e.client("fast", fast.URL)
	e.exec(`INSERT INTO sensors (id, address) SELECT 'h' || i, 'addr' FROM generate_series(1, 1000) i`)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'hang', 'h' || i FROM generate_series(1, 1000) i`)
	e.sensor("f1", "fast one")
	e.subscribe("fast", "f1")
	e.cfg.PerEndpoint = 4
	e.start()
	evs := make([]event.Event, 0, 1000)
	for i := 1; i <= 1000; i++ {
		evs = append(evs, testEvent(fmt.Sprintf("h%d", i), 1, 1))
	}
	e.publish(evs...)
	testenv.Eventually(t, 15*time.Second, "1,000 deliveries pending for the hanging client", func() bool {
		var n int
		_ = e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries WHERE client_id = 'hang' AND state = 'pending'`).Scan(&n)
		return n == 1000 && hang.count() >= 4
	})
	start := time.Now()
	e.publish(testEvent("f1", 1, 0))
	testenv.Eventually(t, 5*time.Second, "the other client's delivery", func() bool { return fast.count() >= 1 })
	took := fast.got()[0].at.Sub(start)
	t.Logf("other client's delivery arrived %s after its event was appended; hanging receiver has %d requests open", took, hang.count())
	if took > time.Second {
		t.Fatalf("delivery to a healthy receiver took %s beside a hanging one, want < 1s", took)
	}
	if c := hang.count(); c > 4 {
		t.Fatalf("hanging receiver got %d concurrent requests, want at most PerEndpoint=4", c)
	}
}

// TestRetryAfterHonoured: a 429 with Retry-After pushes the next attempt back (within the
// longest delay of the schedule); a 500 does not.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond, 3*time.Second)
	rc := newReceiver(t, func(n int, w http.ResponseWriter, _ *http.Request) int {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	})
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 10*time.Second, "second attempt", func() bool { return rc.count() >= 2 })
	hs := rc.got()
	if gap := hs[1].at.Sub(hs[0].at); gap < time.Second || gap > 2500*time.Millisecond {
		t.Fatalf("gap after a 429 with Retry-After: 1 is %s, want about 1s (the schedule says 200ms)", gap)
	}
}

// TestTwoNotifiersShareWork: two notifier processes on one database and one EVENTS stream
// deliver every newest revision once, never an older revision after a newer one, and no
// event twice.
func TestTwoNotifiersShareWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200*time.Millisecond)
	type key struct{ client, sensor string }
	var mu sync.Mutex
	seen := map[key][]int64{}
	ids := map[string]int{}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b gotBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		k := key{r.URL.Query().Get("c"), b.Sensor.ID}
		seen[k] = append(seen[k], b.Revision)
		ids[r.URL.Query().Get("c")+"/"+r.Header.Get("webhook-id")]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
	}))
	t.Cleanup(rc.Close)
	const clients, sensors, revisions = 3, 20, 5
	for c := 0; c < clients; c++ {
		e.client(fmt.Sprintf("c%d", c), fmt.Sprintf("%s/?c=c%d", rc.URL, c))
	}
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'a' FROM generate_series(1, $1::int) i`, sensors)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT c.id, s.id FROM clients c, sensors s`)
	e.cfg.Batch = 8
	e.start()
	e1 := *e
	e.start()
	for r := int64(1); r <= revisions; r++ {
		var evs []event.Event
		for s := 1; s <= sensors; s++ {
			evs = append(evs, testEvent(fmt.Sprintf("s%d", s), r, uint8(r%2)))
		}
		e.publish(evs...)
	}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < clients*sensors {
			return false
		}
		for _, revs := range seen {
			if revs[len(revs)-1] != revisions {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, 20*time.Second, "every newest revision delivered", done)
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for k, revs := range seen {
		total += len(revs)
		for i := 1; i < len(revs); i++ {
			if revs[i] <= revs[i-1] {
				t.Fatalf("%v got revisions %v: out of order or repeated", k, revs)
			}
		}
	}
	for id, n := range ids {
		if n != 1 {
			t.Fatalf("%s delivered %d times", id, n)
		}
	}
	t.Logf("%d deliveries for %d keys × %d revisions (the rest superseded); delivered by the first notifier %v, by the second %v",
		total, clients*sensors, revisions, metricValue(t, &e1, "locks_notifier_attempts_total", "outcome", "delivered"),
		metricValue(t, e, "locks_notifier_attempts_total", "outcome", "delivered"))
}

// TestSameEventTwice: an EVENTS message seen twice (a redelivery, or a re-publication past
// the de-duplication window) makes one delivery per client.
func TestSameEventTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.subscribed(rc.URL)
	e.start()
	ev := testEvent("s1", 1, 1)
	e.publish(ev)
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	// Another Nats-Msg-Id, so JetStream stores it again.
	if _, err := e.nats.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.EventsSubject(partition.Of("s1", testPartitions), "s1"), Data: b},
		jetstream.WithMsgID(ev.ID+"-again")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "delivery", func() bool { return rc.count() >= 1 })
	testenv.Eventually(t, 10*time.Second, "both messages consumed", func() bool {
		for p := 0; p < testPartitions; p++ {
			c, err := e.nats.JS.Consumer(t.Context(), natsx.EventsStream, fmt.Sprintf("notifier-%d", p))
			if err != nil {
				return false
			}
			info, err := c.Info(t.Context())
			if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(300 * time.Millisecond)
	if n := rc.count(); n != 1 {
		t.Fatalf("receiver got %d requests, want 1", n)
	}
}
