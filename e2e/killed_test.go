package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/loadgen"
)

// TestKilledUnderLoadLosesNothing kills the whole system, `locks run` with its embedded NATS
// server at the defaults (LOCKS_NATS_SYNC=always, so readings and events are appended in
// atomic batches), with SIGKILL three times while the load generator publishes, restarting it
// on the same data directory, databases and queue each time. Whatever batch, transaction or
// webhook was in flight at each kill, the books must balance once the system has caught up:
//   - every reading published is in the history exactly once: one READINGS sequence per
//     message_id, none missing (ClickHouse, written from READINGS);
//   - every change became one state_changed event, with revisions 1, 2, 3… per sensor, and
//     one webhook (receivers de-duplicate by webhook-id, so a webhook in flight at a kill may
//     come twice, never with another id), never one older than a revision already received;
//   - sensor_state ends at each sensor's last reading, at the revision of its last event.
//
// Its load would starve the tests that check a latency: they wait until it is recorded.
func TestKilledUnderLoadLosesNothing(t *testing.T) {
	loaded := heavy(t)
	const (
		sensors = 300
		prefix  = "kl"
		rate    = 1500
		// load ends a few seconds after the last kill (about 14 s into it), so that the
		// last restarted process takes its partitions over while readings still come.
		load = 19 * time.Second
	)
	// An attempt in flight at a kill stays leased for the webhook timeout plus a margin after
	// the process is gone; the local receiver answers in milliseconds and the test's Postgres
	// does not stall, so a short timeout and margin bring those attempts back sooner. A killed process's partitions are taken over after
	// its leases expire: a short lease TTL lets each restarted process work sooner, so that
	// the next kill lands on one that owns every partition.
	s := start(t, "LOCKS_WEBHOOK_TIMEOUT=2s", "LOCKS_WEBHOOK_LEASE_MARGIN=8s", "LOCKS_LEASE_TTL=3s")
	rcv, err := loadgen.NewReceiver("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rcv.Close() })
	if err := rcv.Register(t.Context(), "http://"+s.http, s.token, prefix, sensors); err != nil {
		t.Fatal(err)
	}
	type result struct {
		books loadgen.Books
		err   error
	}
	done := make(chan result, 1)
	loadStart := time.Now()
	go func() {
		b, err := loadgen.Run(t.Context(), loadgen.Config{AMQPURL: s.rabbit.URL, Queue: s.rabbit.Queue, Sensors: sensors,
			Rate: rate, ChangeRatio: 0.2, Duration: load, Prefix: prefix, Seed: 17}, nil, testenv.Logger(t))
		done <- result{b, err}
	}()

	// The kills must land on the atomic path: the bridge appends in batches by default.
	testenv.Eventually(t, 30*time.Second, "readings appended in atomic batches and webhooks received", func() bool {
		return s.metric("locks_bridge_batches_total") > 0 && rcv.Tally().Received > 0
	})
	for i, after := range []time.Duration{3 * time.Second, 5 * time.Second, 4 * time.Second} {
		time.Sleep(after)
		s.kill()
		killed := time.Now()
		s.launch()
		t.Logf("kill %d: SIGKILL at %s into the load, ready again %s later", i+1,
			killed.Sub(loadStart).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("loadgen: %v", r.err)
	}
	b := r.books
	t.Logf("published %d readings, %d changes, over %s", b.Published, b.Changes, b.End.Sub(b.Start).Round(time.Millisecond))

	ch, err := clickhouse.Open(&clickhouse.Options{Addr: []string{testenv.ClickHouseAddr()}, Auth: clickhouse.Auth{Database: s.chDB}})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx := t.Context()
	var ids, seqs, events uint64
	caughtUp := func() bool {
		if err := ch.QueryRow(ctx, "SELECT uniqExact(message_id), uniqExact(seq) FROM readings WHERE sensor_id LIKE ?", prefix+"%").Scan(&ids, &seqs); err != nil {
			t.Logf("history readings: %v", err)
			return false
		}
		if err := ch.QueryRow(ctx, "SELECT uniqExact(event_id) FROM events WHERE sensor_id LIKE ? AND type = ?", prefix+"%", event.TypeStateChanged).Scan(&events); err != nil {
			t.Logf("history events: %v", err)
			return false
		}
		if ids < uint64(b.Published) || events < uint64(b.Changes) {
			return false
		}
		loaded() // the readings and events are in; what is left is waiting for the webhooks
		return rcv.Tally().ByType["sensor.state_changed"] >= b.Changes
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !caughtUp() && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a reading, event or webhook written twice would come now
	caughtUp()

	if ids != uint64(b.Published) || seqs != ids {
		t.Errorf("history: %d readings' message ids at %d READINGS sequences, want %d published, each at one sequence", ids, seqs, b.Published)
	}
	if events != uint64(b.Changes) {
		t.Errorf("history: %d state_changed events, want %d changes", events, b.Changes)
	}
	// Revisions per sensor: 1..n, each once.
	rows, err := ch.Query(ctx, `SELECT sensor_id, uniqExact(event_id), uniqExact(revision), min(revision), max(revision)
		FROM events WHERE sensor_id LIKE ? AND type = ? GROUP BY sensor_id`, prefix+"%", event.TypeStateChanged)
	if err != nil {
		t.Fatal(err)
	}
	maxRev := map[string]uint64{}
	for rows.Next() {
		var id string
		var n, revs, lo, hi uint64
		if err := rows.Scan(&id, &n, &revs, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		if n != revs || lo != 1 || hi != n {
			t.Errorf("sensor %s: %d events at %d revisions from %d to %d, want revisions 1..%d once each", id, n, revs, lo, hi, n)
		}
		maxRev[id] = hi
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()

	pool, err := pgxpool.New(ctx, s.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	prows, err := pool.Query(ctx, "SELECT sensor_id, data, revision FROM sensor_state WHERE sensor_id LIKE $1", prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	states := 0
	for prows.Next() {
		var id string
		var data int16
		var rev int64
		if err := prows.Scan(&id, &data, &rev); err != nil {
			t.Fatal(err)
		}
		states++
		if want, ok := b.Last[id]; !ok || uint8(data) != want || uint64(rev) != maxRev[id] {
			t.Errorf("sensor_state %s: data %d revision %d, want data %d (published: %v) revision %d", id, data, rev, want, ok, maxRev[id])
		}
	}
	if err := prows.Err(); err != nil {
		t.Fatal(err)
	}
	if states != len(b.Last) {
		t.Errorf("sensor_state holds %d of the %d sensors published", states, len(b.Last))
	}

	tally := rcv.Tally()
	var problems []string
	for _, p := range loadgen.Check(b, tally, time.Hour, false) {
		// A webhook in flight at a kill is sent again with its webhook-id (at least once).
		if !strings.HasSuffix(p, "duplicate deliveries (same webhook-id)") {
			problems = append(problems, p)
		}
	}
	if tally.OutOfOrder > 0 {
		problems = append(problems, fmt.Sprintf("%d webhooks of a revision older than one already received for their sensor", tally.OutOfOrder))
	}
	for _, p := range problems {
		t.Errorf("webhooks: %s", p)
	}
	t.Logf("recorded %d readings once each, %d events, %d webhooks (%d received again with their webhook-id)",
		ids, events, tally.Received, tally.Duplicates)
}
