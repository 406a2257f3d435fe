package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
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

const feedPartitions = 4

// feedReceiver is a webhook receiver that can be down, recording every body by webhook id.
type feedReceiver struct {
	*httptest.Server
	down atomic.Bool
	mu   sync.Mutex
	got  map[string][][]byte // webhook-id → bodies of every attempt
	ok   map[string]bool     // answered 2xx
}

func newFeedReceiver(t *testing.T) *feedReceiver {
	rc := &feedReceiver{got: map[string][][]byte{}, ok: map[string]bool{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		id := r.Header.Get("webhook-id")
		down := rc.down.Load()
		rc.mu.Lock()
		rc.got[id] = append(rc.got[id], b)
		if !down {
			rc.ok[id] = true
		}
		rc.mu.Unlock()
		if down {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(rc.Close)
	return rc
}

// TestFeedEqualsReceiver runs a real notifier against a receiver that is down for a while
// (its first deliveries die or are superseded), then up: the client's feed lists every event
// its subscriptions selected, once, per sensor in revision order, each byte for byte the body
// the receiver got for it.
func TestFeedEqualsReceiver(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	ne := testenv.NATS(t)
	if err := natsx.Declare(t.Context(), ne.JS, natsx.StreamsConfig{Partitions: feedPartitions, LostAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The circuit never opens: the feed is tested, and an open circuit only spaces out the
	// attempts that make the first deliveries die.
	n, err := notifier.New(notifier.Config{PartitionCount: feedPartitions, RetrySchedule: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond},
		WebhookTimeout: 2 * time.Second, WebhookAllowPrivate: true, PollInterval: 50 * time.Millisecond,
		BreakerCooldown: 50 * time.Millisecond, BreakerMaxCooldown: 100 * time.Millisecond, BreakerThreshold: 1000},
		notifier.Deps{JS: ne.JS, PG: f.db, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "notifier", n.Run, 20*time.Second)

	rc := newFeedReceiver(t)
	f.want(f.do("PATCH", "/v1/clients/"+f.a, map[string]any{"webhook_url": rc.URL}), 200)
	const sensors, downRevs, upRevs = 10, 4, 100
	var ids []string
	for i := range sensors {
		s := fmt.Sprintf("fs%d", i)
		ids = append(ids, s)
		f.want(f.do("POST", "/v1/sensors", map[string]any{"id": s, "address": "Feed street " + s}), 200)
		f.want(f.do("PUT", "/v1/sensors/"+s+"/clients/"+f.a, map[string]any{}), 200)
	}
	// Another client's sensor and deliveries: never in a's feed.
	f.want(f.do("PUT", "/v1/sensors/fs0/clients/"+f.b, map[string]any{}), 200)

	publish := func(from, to int64) {
		var evs []event.Event
		for rev := from; rev <= to; rev++ {
			for _, s := range ids {
				ev := feedEvent(s, rev)
				ev.Partition = partition.Of(s, feedPartitions)
				evs = append(evs, ev)
			}
		}
		for _, ev := range evs {
			if _, err := f.db.Exec(t.Context(), `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq)
				VALUES ($1, $2, $3, now(), now(), now(), $4, 'online', 0)
				ON CONFLICT (sensor_id) DO UPDATE SET revision = greatest(sensor_state.revision, excluded.revision)`,
				ev.SensorID, ev.Partition, int16(ev.Data), ev.Revision); err != nil {
				t.Fatal(err)
			}
		}
		var futs []jetstream.PubAckFuture
		for _, ev := range evs {
			d, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			fut, err := ne.JS.PublishMsgAsync(&nats.Msg{Subject: natsx.EventsSubject(ev.Partition, ev.SensorID), Data: d}, jetstream.WithMsgID(ev.ID))
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, fut)
		}
		for _, fut := range futs {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				t.Fatal(err)
			case <-time.After(30 * time.Second):
				t.Fatal("EVENTS publish not acknowledged")
			}
		}
	}
	settled := func(total int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if f.count(`SELECT count(*) FROM notifier_deliveries WHERE client_id = $1 AND state <> 'pending'`, f.a) == total {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("deliveries not settled: %d of %d", f.count(`SELECT count(*) FROM notifier_deliveries WHERE client_id = $1 AND state <> 'pending'`, f.a), total)
	}

	rc.down.Store(true)
	publish(1, downRevs)
	settled(sensors * downRevs)
	rc.down.Store(false)
	publish(downRevs+1, downRevs+upRevs)
	settled(sensors * (downRevs + upRevs))
	for _, st := range []string{"dead", "superseded", "delivered"} {
		if f.count(`SELECT count(*) FROM notifier_deliveries WHERE client_id = $1 AND state = $2`, f.a, st) == 0 {
			t.Fatalf("no %s delivery: the scenario does not test what it says", st)
		}
	}

	got, _ := readFeedAtLeast(f.env, f.tokA, f.a, "", 97, sensors*(downRevs+upRevs), 10*time.Second)
	if len(got) != sensors*(downRevs+upRevs) {
		t.Fatalf("feed has %d events, want %d", len(got), sensors*(downRevs+upRevs))
	}
	last := map[string]int64{}
	seen := map[string]bool{}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, b := range got {
		var body struct {
			ID     string `json:"id"`
			Sensor struct {
				ID string `json:"id"`
			} `json:"sensor"`
			Revision int64 `json:"revision"`
		}
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatal(err)
		}
		if seen[body.ID] {
			t.Fatalf("event %s twice in the feed", body.ID)
		}
		seen[body.ID] = true
		if body.Revision != last[body.Sensor.ID]+1 {
			t.Fatalf("sensor %s: revision %d after %d", body.Sensor.ID, body.Revision, last[body.Sensor.ID])
		}
		last[body.Sensor.ID] = body.Revision
		for _, rb := range rc.got[body.ID] {
			if !bytes.Equal(rb, b) {
				t.Fatalf("event %s: the receiver got\n%s\nthe feed has\n%s", body.ID, rb, b)
			}
		}
	}
	delivered := 0
	for id := range rc.ok {
		if !seen[id] {
			t.Fatalf("the receiver got %s, which the feed lacks", id)
		}
		delivered++
	}
	if delivered < sensors*upRevs {
		t.Fatalf("the receiver accepted %d events, want at least %d", delivered, sensors*upRevs)
	}
}
