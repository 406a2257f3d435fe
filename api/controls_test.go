package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/notifier"
)

// withControls serves the webhook controls of the notifier on ne's NATS.
func withControls(ne *testenv.NATSEnv) envOpt {
	return func(_ *Config, d *Deps) {
		d.Controls = notifier.NewControls(notifier.ControlsDeps{PG: d.PG, NC: ne.NC})
	}
}

// TestWebhookControlsREST: event type filters are checked and stored, disable and enable
// show on the client, a resend is refused for what it must not send, and a test event is
// queued unless the client's filter leaves it out.
func TestWebhookControlsREST(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withControls(testenv.NATS(t)))
	e.want(e.do("POST", "/v1/clients", map[string]any{"name": "F", "webhook_url": "https://203.0.113.10/hook",
		"event_types": []string{"sensor.state_changed", "sensor.opened"}}), 400, "sensor.opened")
	r := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "F", "webhook_url": "https://203.0.113.10/hook",
		"event_types": []string{"sensor.connection_lost"}}), 200)
	filtered := r.str("id")
	if fmt.Sprint(r.body["event_types"]) != "[sensor.connection_lost]" {
		t.Fatalf("event_types %v", r.body["event_types"])
	}
	e.want(e.do("PATCH", "/v1/clients/"+filtered, map[string]any{"event_types": []string{"nope"}}), 400, "nope")
	r = e.want(e.do("PATCH", "/v1/clients/"+filtered, map[string]any{"event_types": []string{"sensor.connection_lost", "sensor.connection_restored"}}), 200)
	if fmt.Sprint(r.body["event_types"]) != "[sensor.connection_lost sensor.connection_restored]" {
		t.Fatalf("patched event_types %v", r.body["event_types"])
	}
	e.want(e.do("POST", "/v1/clients/"+filtered+":sendTestEvent", nil), 409, "sensor.test")

	e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "S1", "address": "a"}), 200)
	e.want(e.do("PUT", "/v1/sensors/S1/clients/"+filtered, map[string]any{"event_types": []string{"bad"}}), 400, "bad")
	r = e.want(e.do("PUT", "/v1/sensors/S1/clients/"+filtered, map[string]any{"event_types": []string{"sensor.connection_restored"}}), 200)
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE client_id = $1 AND event_types = '{sensor.connection_restored}'`, filtered); n != 1 {
		t.Fatalf("subscription filter not stored: %s", r.raw)
	}
	e.want(e.do("PUT", "/v1/sensors/S1/clients/"+filtered, nil), 200) // again, no body: all types
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE client_id = $1 AND event_types = '{}'`, filtered); n != 1 {
		t.Fatal("subscribing again without event_types did not reset the filter")
	}

	id := fillDeliveries(t, e)
	r = e.want(e.do("POST", "/v1/clients/"+id+":disable", map[string]any{"reason": "receiver moving"}), 200)
	if r.str("disabled_time") == "" || r.str("disabled_reason") != "receiver moving" {
		t.Fatalf("disabled client %s", r.raw)
	}
	if got := e.want(e.do("GET", "/v1/clients/"+id, nil), 200); got.str("disabled_reason") != "receiver moving" {
		t.Fatalf("GET after disable: %s", got.raw)
	}
	r = e.want(e.do("POST", "/v1/clients/"+id+":enable", nil), 200)
	if _, ok := r.body["disabled_time"]; ok && r.body["disabled_time"] != nil || r.str("disabled_reason") != "" {
		t.Fatalf("enabled client %s", r.raw)
	}
	e.want(e.do("POST", "/v1/clients/cl_nope0000000000000000:enable", nil), 404)

	e.want(e.do("POST", "/v1/clients/"+id+"/deliveries/evt_c:resend", nil), 409, "revision 2")
	e.want(e.do("POST", "/v1/clients/"+id+"/deliveries/evt_p:resend", nil), 409, "pending")
	e.want(e.do("POST", "/v1/clients/"+id+"/deliveries/evt_none:resend", nil), 404)
	e.want(e.do("POST", "/v1/clients/"+id+"/deliveries/evt_a:resend", nil), 200)
	e.want(e.do("POST", "/v1/clients/"+id+"/deliveries/evt_c2:resend", nil), 200) // delivered, the newest of S3
	for _, ev := range []string{"evt_a", "evt_c2"} {
		if st, base := e.deliveryState(id, ev); st != "pending" || base == 0 && ev == "evt_a" {
			t.Fatalf("%s after resend: %s, attempt_base %d", ev, st, base)
		}
	}
	r = e.want(e.do("POST", "/v1/clients/"+id+":sendTestEvent", nil), 200)
	if !strings.HasPrefix(r.str("event_id"), "evt_test_") {
		t.Fatalf("sendTestEvent: %s", r.raw)
	}
	if st, _ := e.deliveryState(id, r.str("event_id")); st != "pending" {
		t.Fatalf("test delivery %s", st)
	}
}

// TestClientStatsMatchReceiver: a real notifier delivers to a real receiver that fails the
// first attempt of some webhooks and every attempt of one; GET /v1/clients/{id}/stats and the
// per-client metrics equal what the receiver counted.
func TestClientStatsMatchReceiver(t *testing.T) {
	t.Parallel()
	ne := testenv.NATS(t)
	const partitions = 2
	if err := natsx.Declare(t.Context(), ne.JS, natsx.StreamsConfig{Partitions: partitions, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, withPrivateWebhooks(), withControls(ne))

	var mu sync.Mutex
	hits := map[string][]int{} // webhook-id → statuses answered
	var lastOK time.Time
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Sensor struct{ ID string } `json:"sensor"`
		}
		_ = json.NewDecoder(r.Body).Decode(&b)
		time.Sleep(5 * time.Millisecond) // a measurable latency
		id := r.Header.Get("webhook-id")
		mu.Lock()
		defer mu.Unlock()
		st := http.StatusOK
		switch {
		case b.Sensor.ID == "dead":
			st = http.StatusServiceUnavailable
		case strings.HasSuffix(b.Sensor.ID, "f") && len(hits[id]) == 0:
			st = http.StatusInternalServerError
		}
		hits[id] = append(hits[id], st)
		if st == http.StatusOK {
			lastOK = time.Now()
		}
		w.WriteHeader(st)
	}))
	t.Cleanup(rc.Close)
	id := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "S", "webhook_url": rc.URL}), 200).str("id")
	// One event per sensor: a second would supersede a failed first one.
	sensors := []string{"a", "bf", "c", "df", "dead", "e", "gf", "h"}
	for _, s := range sensors {
		e.want(e.do("POST", "/v1/sensors", map[string]any{"id": s, "address": "x"}), 200)
		e.want(e.do("PUT", "/v1/sensors/"+s+"/clients/"+id, nil), 200)
	}
	reg := prometheus.NewRegistry()
	n, err := notifier.New(notifier.Config{PartitionCount: partitions, RetrySchedule: []time.Duration{100 * time.Millisecond},
		WebhookTimeout: 2 * time.Second, WebhookAllowPrivate: true, PollInterval: 100 * time.Millisecond, BreakerThreshold: 100},
		notifier.Deps{JS: ne.JS, PG: e.db, Logger: testenv.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "notifier", n.Run, 20*time.Second)
	for _, s := range sensors {
		publishEvent(t, e, ne.JS, partitions, s, 1)
	}
	testenv.Eventually(t, 20*time.Second, "every delivery finished", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE client_id = $1 AND state IN ('delivered', 'dead')`, id) == len(sensors)
	})

	var delivered, failed, retried, dead int
	mu.Lock()
	for _, sts := range hits {
		ok := false
		for _, st := range sts {
			if st == http.StatusOK {
				ok = true
			} else {
				failed++
			}
		}
		if ok {
			delivered++
		} else {
			dead++
		}
		if len(sts) > 1 {
			retried++
		}
	}
	last := lastOK
	mu.Unlock()
	t.Logf("receiver: %d delivered, %d failed attempts, %d retried, %d dead", delivered, failed, retried, dead)

	st := e.want(e.do("GET", "/v1/clients/"+id+"/stats", nil), 200)
	got := fmt.Sprintf("%v/%v/%v/%v/%v", st.body["delivered"], st.body["failed_attempts"], st.body["retried"], st.body["dead"], st.body["pending"])
	if want := fmt.Sprintf("%d/%d/%d/%d/0", delivered, failed, retried, dead); got != want {
		t.Fatalf("stats delivered/failed_attempts/retried/dead/pending %s, receiver counted %s: %s", got, want, st.raw)
	}
	p50, p90, p99 := st.body["latency_p50_ms"].(float64), st.body["latency_p90_ms"].(float64), st.body["latency_p99_ms"].(float64)
	if p50 < 5 || p90 < p50 || p99 < p90 {
		t.Errorf("latency percentiles %v, %v, %v: want ≥ 5 ms and growing", p50, p90, p99)
	}
	lst, err := time.Parse(time.RFC3339Nano, st.str("last_success_time"))
	if err != nil || lst.Sub(last).Abs() > time.Second {
		t.Errorf("last_success_time %q, the receiver's last 2xx at %s", st.str("last_success_time"), last)
	}

	// The same figures in /metrics, under the client's own label.
	metric := func(outcome string) float64 {
		return (&env{t: t, reg: reg}).metric("locks_notifier_client_attempts_total", id, outcome)
	}
	if d, r, x := metric(event.OutcomeDelivered), metric(event.OutcomeRetry), metric(event.OutcomeDead); int(d) != delivered || int(r+x) != failed || int(x) != dead {
		t.Errorf("metrics: delivered %v, retry %v, dead %v; receiver: %d delivered, %d failed, %d dead", d, r, x, delivered, failed, dead)
	}
}

// publishEvent appends a state change of sensor at rev to EVENTS as the state projector
// does, after its state has reached rev (the notifier checks that).
func publishEvent(t *testing.T, e *env, js jetstream.JetStream, partitions int, sensor string, rev int64) {
	t.Helper()
	p := partition.Of(sensor, partitions)
	e.setState(sensor, int(rev%2), "online", rev)
	ev := event.Event{V: event.Version, ID: event.ID(sensor, rev), Type: event.TypeStateChanged, OccurredAt: time.Now().UTC(),
		SensorID: sensor, Data: uint8(rev % 2), Revision: rev, Partition: p}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: natsx.EventsSubject(p, sensor), Data: b}, jetstream.WithMsgID(ev.ID)); err != nil {
		t.Fatal(err)
	}
}
