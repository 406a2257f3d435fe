package state

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
	"github.com/lock-sensors/lock-sensors/notifier"
	"github.com/lock-sensors/lock-sensors/projector/history"
)

// historyCaughtUp says whether every history consumer has acked everything of its stream.
func historyCaughtUp(t testing.TB, e *stateEnv) bool {
	t.Helper()
	names := map[string][]string{natsx.DeliveriesStream: {"history_deliveries"}}
	for p := range e.n {
		names[natsx.ReadingsStream] = append(names[natsx.ReadingsStream], "history_readings_"+strconv.Itoa(p))
		names[natsx.EventsStream] = append(names[natsx.EventsStream], "history_events_"+strconv.Itoa(p))
	}
	for stream, ns := range names {
		for _, n := range ns {
			c, err := e.nats.JS.Consumer(t.Context(), stream, n)
			if err != nil {
				return false
			}
			info, err := c.Info(t.Context())
			if err != nil || info.NumPending+uint64(info.NumAckPending) > 0 {
				return false
			}
		}
	}
	return true
}

func chCount(t testing.TB, ch driver.Conn, q string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := ch.QueryRow(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// The must-show of the rebuild: 200,000 readings of 4,000 sensors with changes, then
// liveness facts that lose a tenth of them and readings that restore half of those, applied
// by the live state and history projectors while the notifier delivers the events of 40
// subscribed sensors to a real HTTP receiver. Both projections are then rebuilt from the log
// and swapped in: the rebuilt sensor_state equals the live one row by row, each rebuilt
// ClickHouse table (readings, events, deliveries) has exactly the live one's distinct rows,
// and the rebuild adds nothing to EVENTS, the outbox or the notifier's deliveries, and the
// receiver gets no request after it.
func TestRebuild200kEqualsLive(t *testing.T) {
	t.Parallel()
	const sensors, count, subscribed = 4000, 200_000, 40
	const publishAhead = 10_000
	t0 := time.Now()
	e := newStateEnv(t, 4)
	_, ch := testenv.ClickHouse(t)

	// The receiver, subscribed to sensors that get lost and restored as well as changed.
	var received atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	ids := stateSensorIDs(rand.New(rand.NewPCG(3, 7)), sensors) // as rebuildLog(3, …) draws them
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := e.pg.Exec(t.Context(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO clients (id, name, webhook_url, signing_secret) VALUES ('cl_rebuild', 'rebuild receiver', $1, 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=')`, recv.URL)
	for _, id := range ids[:subscribed] {
		exec(`INSERT INTO sensors (id, address) VALUES ($1, 'somewhere')`, id)
		exec(`INSERT INTO subscriptions (client_id, sensor_id) VALUES ('cl_rebuild', $1)`, id)
	}
	nt, err := notifier.New(notifier.Config{PartitionCount: e.n, RetrySchedule: config.DefaultRetrySchedule, WebhookTimeout: 2 * time.Second,
		WebhookAllowPrivate: true, PollInterval: 50 * time.Millisecond},
		notifier.Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "notifier", nt.Run, 20*time.Second)

	// Live at the default liveness interval: rows are written per change, and the liveness
	// of repeats once it is due.
	e.seen = SeenIntervalDefault
	e.runState(t, e.nats.JS, partition.All(e.n))
	hist, err := history.New(history.Config{Partitions: partition.All(e.n), BatchSize: 20_000, FlushInterval: 100 * time.Millisecond},
		history.Deps{JS: e.nats.JS, CH: ch, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunPart(t, "History", hist.Run, 20*time.Second)

	// Published while the projectors read, never far ahead of the state projector: a
	// partition's consumer far behind in a block of many sensors costs the NATS server a
	// walk over the block's subjects for each message it delivers, and the test is about
	// the live path.
	var pub statePublished
	logs := rebuildLog(3, sensors, count)
	gen, published := rebuildSliceGen(logs), 0
	paced := func() (event.Log, bool) {
		if published++; published%publishAhead == 0 {
			testenv.Eventually(t, time.Minute, "the state projector within reach of the publisher", func() bool {
				applied := e.appliedSeqs(t)
				for p := range e.n {
					if applied[p]+publishAhead < uint64(published) {
						return false
					}
				}
				return true
			})
		}
		return gen()
	}
	rebuildPublishFast(t, e.nats.NC, e.n, paced, &pub)
	t.Logf("%s: %d messages published", time.Since(t0).Round(time.Millisecond), len(logs))
	e.waitCaughtUp(t, &pub, 120*time.Second)
	t.Logf("%s: state caught up", time.Since(t0).Round(time.Millisecond))

	// Everything delivered and in the history: the state, the events of the subscribed
	// sensors as deliveries, the attempts in DELIVERIES and ClickHouse.
	var subIDs []string
	subIDs = append(subIDs, ids[:subscribed]...)
	// The cheap checks first; the ClickHouse counts (whole-table scans, competing with the
	// projectors for the CPU) at most twice a second.
	var chAt time.Time
	testenv.Eventually(t, 120*time.Second, "deliveries and history settled", func() bool {
		var rows, open int
		if err := e.pg.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE state = 'pending') + (SELECT count(*) FROM notifier_attempt_outbox)
			FROM notifier_deliveries`).Scan(&rows, &open); err != nil {
			t.Fatal(err)
		}
		if open != 0 || time.Since(chAt) < 500*time.Millisecond || !historyCaughtUp(t, e) {
			return false
		}
		chAt = time.Now()
		want := chCount(t, ch, `SELECT toUInt64(count(DISTINCT event_id)) FROM events WHERE has(?, sensor_id)`, subIDs)
		return want > 0 && uint64(rows) == want && received.Load() >= int64(want) &&
			chCount(t, ch, `SELECT toUInt64(count(DISTINCT event_id)) FROM deliveries`) == want
	})
	e.waitSeenWritten(t, 2*SeenIntervalDefault)
	t.Logf("%s: live projections caught up, deliveries settled, liveness written", time.Since(t0).Round(time.Millisecond))
	liveState := loadStateTable(t, e, "sensor_state")
	lost := 0
	for _, r := range liveState {
		if r.Connection == "lost" {
			lost++
		}
	}
	events := chCount(t, ch, `SELECT toUInt64(count(DISTINCT event_id)) FROM events`)
	if len(liveState) < sensors || lost < sensors/40 || events < 20_000 || received.Load() < 2*subscribed {
		t.Fatalf("test data: %d sensors, %d lost, %d events, %d webhooks: want changes, lost periods and deliveries", len(liveState), lost, events, received.Load())
	}
	evsBefore, delivBefore, recvBefore := eventsLastSeq(t, e), 0, received.Load()
	if err := e.pg.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries`).Scan(&delivBefore); err != nil {
		t.Fatal(err)
	}

	// Rebuild both, the live projectors and the notifier running. The two projections share
	// nothing, so their rebuilds run side by side.
	hr, err := history.NewRebuild(history.RebuildConfig{}, history.RebuildDeps{JS: e.nats.JS, CH: ch, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var hres rebuild.Result
	hdone := make(chan error, 1)
	go func() {
		var err error
		hres, err = hr.Run(t.Context())
		hdone <- err
	}()
	res, err := e.newRebuild(t, RebuildConfig{}).Run(t.Context())
	if herr := <-hdone; err != nil || herr != nil {
		t.Fatalf("state rebuild: %v; history rebuild: %v", err, herr)
	}
	t.Logf("%s: state rebuild: %d messages, %d events checked, in %s; history rebuild: %d messages in %s", time.Since(t0).Round(time.Millisecond),
		res.Applied, res.EventsChecked, res.Elapsed.Round(time.Millisecond), hres.Applied, hres.Elapsed.Round(time.Millisecond))

	// Nothing for receivers: no event, no outbox row, no delivery, no request, also after
	// the notifier has had many polls to find one. Watched while the rebuilt tables are
	// compared.
	quiet := make(chan error, 1)
	go func() {
		quiet <- rebuildStaysQuiet(t.Context(), e, &received, evsBefore, delivBefore, recvBefore, 1500*time.Millisecond)
	}()

	afterRebuild(t, e, res)
	if res.Applied != uint64(len(logs)) {
		t.Errorf("state rebuild applied %d messages, want the %d of the log", res.Applied, len(logs))
	}
	equalRows(t, "rebuilt sensor_state vs the live one", loadStateTable(t, e, "sensor_state"), liveState)
	for _, tb := range chschema.Tables {
		n1, s1 := historyDigest(t, ch, tb, tb.Name)
		n0, s0 := historyDigest(t, ch, tb, tb.Name+hres.OldTable)
		if n0 == 0 || n1 != n0 || s1 != s0 {
			t.Errorf("%s: rebuilt %d distinct rows (digest %d), live %d (digest %d): want equal, not empty", tb.Name, n1, s1, n0, s0)
		}
	}
	readings := 0
	for _, l := range logs {
		if l.Kind == event.KindReading {
			readings++
		}
	}
	if n := chCount(t, ch, `SELECT toUInt64(count(DISTINCT seq)) FROM readings`); n != uint64(readings) {
		t.Errorf("rebuilt readings: %d distinct, want the %d readings of the log", n, readings)
	}
	if err := <-quiet; err != nil {
		t.Fatal(err)
	}
}

// rebuildStaysQuiet checks for the window that EVENTS stays at its last sequence evsBefore,
// the outbox empty and the notifier's deliveries and received requests at their counts.
func rebuildStaysQuiet(ctx context.Context, e *stateEnv, received *atomic.Int64, evsBefore uint64, delivBefore int, recvBefore int64, window time.Duration) error {
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		var outbox, deliv int
		if err := e.pg.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM notifier_deliveries)`).Scan(&outbox, &deliv); err != nil {
			return err
		}
		s, err := logread.StreamState(ctx, e.nats.JS, natsx.EventsStream)
		if err != nil {
			return err
		}
		if s.LastSeq != evsBefore || outbox != 0 || deliv != delivBefore || received.Load() != recvBefore {
			return fmt.Errorf("after the rebuild: EVENTS at seq %d (was %d), %d outbox rows, %d deliveries (were %d), %d webhooks received (were %d)",
				s.LastSeq, evsBefore, outbox, deliv, delivBefore, received.Load(), recvBefore)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// historyDigest is the distinct rows of a copy (table) of a history table as a count and a
// sum of row hashes.
func historyDigest(t testing.TB, ch driver.Conn, tb chschema.Table, table string) (n, sum uint64) {
	t.Helper()
	var hs []string
	for _, c := range tb.Names() {
		hs = append(hs, "ifNull(toString("+c+"), 'NULL')")
	}
	q := "SELECT toUInt64(count()), toUInt64(sum(cityHash64(" + strings.Join(hs, ", ") + "))) FROM (SELECT DISTINCT " + tb.List() + " FROM " + table + ")"
	if err := ch.QueryRow(t.Context(), q).Scan(&n, &sum); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n, sum
}
