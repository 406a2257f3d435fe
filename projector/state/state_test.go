package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Many tests wait on leases and timers, each on its own database and NATS.
func TestMain(m *testing.M) { testenv.Main(m, 4) }

// stateEnv is one READINGS/EVENTS log and one database.
type stateEnv struct {
	nats   *testenv.NATSEnv
	pgURL  string
	pg     *pgxpool.Pool
	n      int                  // partitions
	reg    *prometheus.Registry // of the last State run by runState
	batch  int                  // Config.BatchSize for runState (0: the default)
	tracer trace.Tracer         // Deps.Tracer for runState (nil: no tracing)
	seen   time.Duration        // Config.SeenInterval for runState (0: every reading written)
	clock  clock.Clock          // Deps.Clock for runState (nil: the system clock)
}

func newStateEnv(t testing.TB, n int) *stateEnv {
	return newStateEnvWith(t, natsx.StreamsConfig{Partitions: n})
}

// newStateEnvDup sets the streams' de-duplication window (0: the default).
func newStateEnvDup(t testing.TB, n int, dup time.Duration) *stateEnv {
	return newStateEnvWith(t, natsx.StreamsConfig{Partitions: n, Duplicates: dup})
}

// newStateEnvWith declares the streams and buckets as sc says (LostAfter: an hour).
func newStateEnvWith(t testing.TB, sc natsx.StreamsConfig) *stateEnv {
	t.Helper()
	e := &stateEnv{nats: testenv.NATS(t), n: sc.Partitions}
	e.pgURL, e.pg = testenv.Postgres(t)
	sc.LostAfter = time.Hour
	if err := natsx.Declare(t.Context(), e.nats.JS, sc); err != nil {
		t.Fatal(err)
	}
	return e
}

// statePublished is a log as the stream holds it: each message with its stream sequence.
type statePublished struct {
	logs   []event.Log
	seqs   []uint64
	maxSeq map[int]uint64 // last sequence per partition
}

func stateMsgID(l event.Log) string {
	if l.MessageID != "" {
		return l.MessageID
	}
	return l.Kind + "/" + l.SensorID + "/" + strconv.FormatInt(l.ReceivedTime.UnixNano(), 10)
}

// publish appends logs to READINGS in order (async, in windows), retrying through NATS
// restarts; the message id makes a retried append count once.
func (e *stateEnv) publish(t testing.TB, js jetstream.JetStream, logs []event.Log, into *statePublished) {
	t.Helper()
	if into.maxSeq == nil {
		into.maxSeq = map[int]uint64{}
	}
	const window = 2000
	for start := 0; start < len(logs); {
		end := min(start+window, len(logs))
		futs := make([]jetstream.PubAckFuture, 0, end-start)
		var err error
		for _, l := range logs[start:end] {
			var f jetstream.PubAckFuture
			f, err = js.PublishMsgAsync(&nats.Msg{Subject: natsx.ReadingsSubject(l.SensorID), Data: stateJSON(t, l)},
				jetstream.WithMsgID(stateMsgID(l)))
			if err != nil {
				break
			}
			futs = append(futs, f)
		}
		acks := make([]*jetstream.PubAck, 0, len(futs))
		for _, f := range futs {
			select {
			case a := <-f.Ok():
				acks = append(acks, a)
			case e := <-f.Err():
				err = e
			case <-time.After(30 * time.Second):
				err = errors.New("no publish ack within 30s")
			}
			if err != nil {
				break
			}
		}
		if err != nil || len(acks) < end-start {
			// Publish the window again, in order; what was stored is de-duplicated.
			t.Logf("publish window %d-%d again: %v", start, end, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for i, a := range acks {
			l := logs[start+i]
			into.logs = append(into.logs, l)
			into.seqs = append(into.seqs, a.Sequence)
			p := partition.Of(l.SensorID, e.n)
			into.maxSeq[p] = max(into.maxSeq[p], a.Sequence)
		}
		start = end
	}
}

func stateJSON(t testing.TB, l event.Log) []byte {
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runState runs a State on parts until the returned stop is called (or the test ends).
func (e *stateEnv) runState(t testing.TB, js jetstream.JetStream, parts partition.Set) (stop func()) {
	t.Helper()
	e.reg = prometheus.NewRegistry()
	s, err := New(Config{Partitions: parts, PartitionCount: e.n, IdleWait: 200 * time.Millisecond, RelayPoll: 100 * time.Millisecond,
		BatchSize: e.batch, SeenInterval: e.seen}, Deps{JS: js, PG: e.pg, Logger: testenv.Logger(t), Registerer: e.reg, Tracer: e.tracer, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	return testenv.RunPart(t, "State", s.Run, 20*time.Second)
}

// waitCaughtUp waits until every partition's checkpoint reaches its last sequence and the
// outbox is empty (so EVENTS holds every event).
func (e *stateEnv) waitCaughtUp(t testing.TB, pub *statePublished, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var behind []string
		for p, want := range pub.maxSeq {
			var seq int64
			_ = e.pg.QueryRow(t.Context(), `SELECT coalesce(max(seq), 0) FROM checkpoints WHERE projection = 'state' AND partition = $1`, p).Scan(&seq)
			if uint64(seq) < want {
				behind = append(behind, fmt.Sprintf("p%d %d<%d", p, seq, want))
			}
		}
		var outbox int
		_ = e.pg.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&outbox)
		if len(behind) == 0 && outbox == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not caught up within %s: behind %v, %d outbox rows", within, behind, outbox)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readStateEvents reads the whole EVENTS stream in order.
func readStateEvents(t testing.TB, js jetstream.JetStream) []event.Event {
	t.Helper()
	ctx := t.Context()
	st, err := js.Stream(ctx, natsx.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := int(info.State.Msgs)
	if total == 0 {
		return nil
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]event.Event, 0, total)
	for len(out) < total {
		b, err := c.Fetch(min(total-len(out), 5000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			ev, err := event.DecodeEvent(m.Data())
			if err != nil {
				t.Fatal(err)
			}
			if want := natsx.EventsSubject(ev.Partition, ev.SensorID); m.Subject() != want {
				t.Fatalf("event %s on subject %s, want %s", ev.ID, m.Subject(), want)
			}
			out = append(out, ev)
			n++
		}
		if n == 0 {
			t.Fatalf("EVENTS: read %d of %d messages", len(out), total)
		}
	}
	return out
}

// The model: an independent, plain rendering of the rules of docs/contract.md section 2.

type stateModelRow struct {
	Partition       int
	Data            uint8
	LastSeen        time.Time
	LastReadingTime time.Time
	ChangedAt       time.Time
	Revision        int64
	Connection      string
	LastSeq         uint64
}

type stateModelEvent struct {
	Type       string
	Data       uint8
	Prev       string // "" for null
	Revision   int64
	Seq        uint64
	OccurredAt time.Time
}

type stateModel struct {
	rows   map[string]*stateModelRow
	events map[string][]stateModelEvent
	total  int
}

func buildStateModel(pub *statePublished, n int) stateModel {
	m := stateModel{rows: map[string]*stateModelRow{}, events: map[string][]stateModelEvent{}}
	add := func(id string, r *stateModelRow, typ string, at time.Time, data uint8, prev string, seq uint64) {
		r.Revision++
		m.events[id] = append(m.events[id], stateModelEvent{Type: typ, Data: data, Prev: prev, Revision: r.Revision, Seq: seq, OccurredAt: at})
		m.total++
	}
	for i, l := range pub.logs {
		seq := pub.seqs[i]
		r := m.rows[l.SensorID]
		switch l.Kind {
		case event.KindReading:
			if r == nil {
				r = &stateModelRow{Partition: partition.Of(l.SensorID, n), Data: l.Data, ChangedAt: l.Time, Connection: "online"}
				m.rows[l.SensorID] = r
				add(l.SensorID, r, event.TypeStateChanged, l.Time, l.Data, "", seq)
			} else {
				prev := strconv.Itoa(int(r.Data))
				if r.Connection == "lost" {
					r.Connection = "online"
					add(l.SensorID, r, event.TypeConnectionRestored, l.ReceivedTime, l.Data, prev, seq)
				}
				if r.Data != l.Data {
					r.Data, r.ChangedAt = l.Data, l.Time
					add(l.SensorID, r, event.TypeStateChanged, l.Time, l.Data, prev, seq)
				}
			}
			r.LastSeen, r.LastReadingTime, r.LastSeq = l.ReceivedTime, l.Time, seq
		case event.KindLivenessTimeout:
			if r != nil && r.Connection == "online" && l.ReceivedTime.Sub(r.LastSeen) >= l.LostAfter {
				r.Connection, r.LastSeq = "lost", seq
				add(l.SensorID, r, event.TypeConnectionLost, l.ReceivedTime, r.Data, strconv.Itoa(int(r.Data)), seq)
			}
		}
	}
	return m
}

func loadStateRows(t testing.TB, pg *pgxpool.Pool) map[string]stateModelRow {
	t.Helper()
	return loadStateRowsFrom(t, pg, "sensor_state")
}

// loadStateRowsFrom reads a table shaped like sensor_state (the live one, or a rebuild's).
func loadStateRowsFrom(t testing.TB, pg *pgxpool.Pool, table string) map[string]stateModelRow {
	t.Helper()
	rows, err := pg.Query(t.Context(), `SELECT sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq FROM `+
		pgx.Identifier{table}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]stateModelRow{}
	for rows.Next() {
		var id string
		var r stateModelRow
		var data int16
		var seq int64
		if err := rows.Scan(&id, &r.Partition, &data, &r.LastSeen, &r.LastReadingTime, &r.ChangedAt, &r.Revision, &r.Connection, &seq); err != nil {
			t.Fatal(err)
		}
		r.Data, r.LastSeq = uint8(data), uint64(seq)
		r.LastSeen, r.LastReadingTime, r.ChangedAt = r.LastSeen.UTC(), r.LastReadingTime.UTC(), r.ChangedAt.UTC()
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkStateAgainstModel asserts sensor_state and EVENTS are exactly what the model says.
func checkStateAgainstModel(t testing.TB, e *stateEnv, pub *statePublished) {
	t.Helper()
	checkStateAgainst(t, e, buildStateModel(pub, e.n))
}

func checkStateAgainst(t testing.TB, e *stateEnv, m stateModel) {
	t.Helper()
	got := loadStateRows(t, e.pg)
	if len(got) != len(m.rows) {
		t.Errorf("sensor_state has %d rows, want %d", len(got), len(m.rows))
	}
	bad := 0
	for id, want := range m.rows {
		if g, ok := got[id]; !ok || g != *want {
			if bad++; bad <= 5 {
				t.Errorf("sensor %s: row %+v, want %+v", id, g, *want)
			}
		}
	}
	evs := readStateEvents(t, e.nats.JS)
	if len(evs) != m.total {
		t.Errorf("EVENTS holds %d events, want %d", len(evs), m.total)
	}
	per := map[string][]event.Event{}
	for _, ev := range evs {
		per[ev.SensorID] = append(per[ev.SensorID], ev)
	}
	bad = 0
	for id, want := range m.events {
		have := per[id]
		gotM := make([]stateModelEvent, len(have))
		for i, ev := range have {
			prev := ""
			if ev.PreviousData != nil {
				prev = strconv.Itoa(int(*ev.PreviousData))
			}
			gotM[i] = stateModelEvent{Type: ev.Type, Data: ev.Data, Prev: prev, Revision: ev.Revision, Seq: ev.Seq, OccurredAt: ev.OccurredAt.UTC()}
			if ev.ID != event.ID(id, ev.Revision) || ev.Partition != partition.Of(id, e.n) {
				t.Errorf("event %+v: wrong id or partition", ev)
			}
		}
		if !slices.Equal(gotM, want) {
			if bad++; bad <= 5 {
				t.Errorf("sensor %s events in EVENTS order:\n got %+v\nwant %+v", id, gotM, want)
			}
		}
	}
	for id := range per {
		if _, ok := m.events[id]; !ok {
			t.Errorf("events of sensor %s that the model does not expect", id)
		}
	}
}

// stateRandomReadings makes count readings of sensors ids, each repeating its last value with
// probability repeat; times are strictly increasing, in microseconds.
func stateRandomReadings(r *rand.Rand, ids []string, count int, repeat float64, start time.Time) []event.Log {
	last := map[string]uint8{}
	logs := make([]event.Log, count)
	for i := range logs {
		id := ids[r.IntN(len(ids))]
		d, ok := last[id]
		if !ok || r.Float64() >= repeat {
			d = uint8(r.IntN(2))
		}
		last[id] = d
		recv := start.Add(time.Duration(i) * time.Millisecond)
		logs[i] = event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d,
			Time: recv.Add(-time.Duration(r.IntN(1000)) * time.Microsecond), ReceivedTime: recv,
			MessageID: "m" + strconv.FormatInt(recv.UnixNano(), 36)}
	}
	return logs
}

func stateSensorIDs(r *rand.Rand, n int) []string {
	const abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	ids := make([]string, n)
	for i := range ids {
		b := make([]byte, 1+r.IntN(16))
		for j := range b {
			b[j] = abc[r.IntN(len(abc))]
		}
		ids[i] = string(b) + strconv.Itoa(i) // unique
		if len(ids[i]) > 16 {
			ids[i] = ids[i][len(ids[i])-16:]
		}
	}
	return ids
}

var stateT0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func TestStateTenThousandReadings(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 8)
	r := rand.New(rand.NewPCG(1, 2))
	ids := stateSensorIDs(r, 1000)
	var pub statePublished
	e.publish(t, e.nats.JS, stateRandomReadings(r, ids, 10000, 0.6, stateT0), &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	checkStateAgainstModel(t, e, &pub)
	m := buildStateModel(&pub, e.n)
	t.Logf("%d readings of %d sensors: %d events", len(pub.logs), len(ids), m.total)
	if m.total <= len(ids) || m.total >= 10000 {
		t.Fatalf("test data: %d events of 10000 readings over %d sensors: want repeats and changes", m.total, len(ids))
	}
}

// TestHelperStateProcess is not a test: it is the child process of the crash tests, running
// the state projector until its crash point kills it.
func TestHelperStateProcess(t *testing.T) {
	if os.Getenv("LOCKS_TEST_STATE_CHILD") != "1" {
		return
	}
	crashpoint.ArmFromEnv()
	n, _ := strconv.Atoi(os.Getenv("LOCKS_TEST_PARTITIONS"))
	js := testenv.JetStream(t, os.Getenv("LOCKS_TEST_NATS_URL"), "state-child")
	pg, err := pgxpool.New(t.Context(), os.Getenv("LOCKS_TEST_PG_URL"))
	if err != nil {
		t.Fatal(err)
	}
	seen, _ := time.ParseDuration(os.Getenv("LOCKS_TEST_SEEN_INTERVAL")) // none: every reading written
	batch, _ := strconv.Atoi(os.Getenv("LOCKS_TEST_BATCH"))              // none: the default
	s, err := New(Config{Partitions: partition.All(n), PartitionCount: n, IdleWait: 200 * time.Millisecond, RelayPoll: 100 * time.Millisecond,
		SeenInterval: seen, BatchSize: batch}, Deps{JS: js, PG: pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	err = s.Run(ctx)
	t.Fatalf("crash point %s never hit (Run returned %v)", os.Getenv(crashpoint.Env), err)
}

func TestStateCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		point string
		// dup is the de-duplication window; the restart waits it out, so that only the
		// relay's own check keeps a republished event from being stored twice.
		dup time.Duration
		// left checks what the crash left behind, so the test shows it crashed where it says.
		left func(t *testing.T, e *stateEnv)
	}{
		{CrashAfterCommit + ":3", 0, func(t *testing.T, e *stateEnv) {
			// Committed but never acked: some checkpoint is past its consumer's ack floor.
			ahead := false
			rows, err := e.pg.Query(t.Context(), `SELECT partition, seq FROM checkpoints WHERE projection = 'state'`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var p int
				var seq int64
				if err := rows.Scan(&p, &seq); err != nil {
					t.Fatal(err)
				}
				c, err := e.nats.JS.Consumer(t.Context(), natsx.ReadingsStream, consumerName(p))
				if err != nil {
					t.Fatal(err)
				}
				info, err := c.Info(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if uint64(seq) > info.AckFloor.Stream {
					ahead = true
				}
			}
			if !ahead {
				t.Error("after the crash no checkpoint is ahead of its consumer's ack floor")
			}
		}},
		{CrashRelayAfterPublish + ":2", time.Second, func(t *testing.T, e *stateEnv) {
			// Published but not deleted: outbox rows whose events are in EVENTS already.
			var ids []string
			if err := e.pg.QueryRow(t.Context(), `SELECT coalesce(array_agg(event_id), '{}') FROM outbox`).Scan(&ids); err != nil {
				t.Fatal(err)
			}
			in := map[string]bool{}
			for _, ev := range readStateEvents(t, e.nats.JS) {
				in[ev.ID] = true
			}
			both := 0
			for _, id := range ids {
				if in[id] {
					both++
				}
			}
			if both == 0 {
				t.Errorf("after the crash: %d outbox rows, none already in EVENTS (%d events)", len(ids), len(in))
			}
		}},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t.Parallel()
			e := newStateEnvDup(t, 4, tc.dup)
			r := rand.New(rand.NewPCG(3, 4))
			var pub statePublished
			e.publish(t, e.nats.JS, stateRandomReadings(r, stateSensorIDs(r, 300), 6000, 0.5, stateT0), &pub)

			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperStateProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "LOCKS_TEST_STATE_CHILD=1", crashpoint.Env+"="+tc.point,
				"LOCKS_TEST_NATS_URL="+e.nats.URL, "LOCKS_TEST_PG_URL="+e.pgURL, "LOCKS_TEST_PARTITIONS="+strconv.Itoa(e.n))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
				t.Fatalf("child: %v, want exit code %d; output:\n%s", err, crashpoint.ExitCode, out)
			}
			tc.left(t, e)
			time.Sleep(tc.dup + 200*time.Millisecond)

			e.runState(t, e.nats.JS, partition.All(e.n))
			e.waitCaughtUp(t, &pub, 60*time.Second)
			checkStateAgainstModel(t, e, &pub)
		})
	}
}

func TestStateNATSRestart(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	r := rand.New(rand.NewPCG(5, 6))
	ids := stateSensorIDs(r, 500)
	logs := stateRandomReadings(r, ids, 10000, 0.5, stateT0)
	var pub statePublished
	e.publish(t, e.nats.JS, logs[:5000], &pub)

	// The projector on a connection of its own that rides out the restart, as in production.
	js := testenv.JetStream(t, e.nats.URL, "state")
	stop := e.runState(t, js, partition.All(e.n))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		_ = e.pg.QueryRow(t.Context(), `SELECT count(*) FROM sensor_state`).Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing applied within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.nats.Restart(500 * time.Millisecond)
	e.publish(t, e.nats.JS, logs[5000:], &pub)
	e.waitCaughtUp(t, &pub, 90*time.Second)
	stop()
	checkStateAgainstModel(t, e, &pub)
}

// stateLivenessScript is a log with liveness facts, and what it must yield per sensor.
func stateLivenessScript() ([]event.Log, map[string][]string, map[string]string) {
	h := time.Hour
	rd := func(id string, d uint8, at time.Duration) event.Log {
		return event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d, Time: stateT0.Add(at), ReceivedTime: stateT0.Add(at),
			MessageID: id + "/" + at.String()}
	}
	fact := func(id string, at, lostAfter time.Duration) event.Log {
		return event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: id, ReceivedTime: stateT0.Add(at), Time: stateT0.Add(at), LostAfter: lostAfter}
	}
	logs := []event.Log{
		// lost after a full hour of silence; the next reading restores it and changes it.
		rd("lost", 0, 0), fact("lost", h, h), rd("lost", 1, 2*h),
		// a reading came in between: the fact is stale.
		rd("stale", 1, 0), rd("stale", 1, 30*time.Minute), fact("stale", h, h),
		// lost twice in a row counts once; restored without a change of data.
		rd("twice", 1, 0), fact("twice", h+time.Second, h), fact("twice", 2*h, h), rd("twice", 1, 3*h),
		// never heard of: nothing.
		fact("ghost", h, h),
		// its own timeout of 15 minutes, one microsecond short and then enough.
		rd("short", 0, 0), fact("short", 15*time.Minute-time.Microsecond, 15*time.Minute), fact("short", 15*time.Minute, 15*time.Minute),
		// lost, back, lost again.
		rd("flap", 1, 0), fact("flap", h, h), rd("flap", 0, 90*time.Minute), rd("flap", 0, 100*time.Minute), fact("flap", 160*time.Minute, h),
	}
	sc, cl, cr := event.TypeStateChanged, event.TypeConnectionLost, event.TypeConnectionRestored
	want := map[string][]string{
		"lost":  {sc, cl, cr, sc},
		"stale": {sc},
		"twice": {sc, cl, cr},
		"short": {sc, cl},
		"flap":  {sc, cl, cr, sc, cl},
	}
	conn := map[string]string{"lost": "online", "stale": "online", "twice": "online", "short": "lost", "flap": "lost"}
	return logs, want, conn
}

func TestStateLiveness(t *testing.T) {
	t.Parallel()
	logs, want, conn := stateLivenessScript()
	// Many batches or one: the same rows and events.
	var envs []*stateEnv
	for _, batchOne := range []bool{false, true} {
		e := newStateEnv(t, 2)
		var pub statePublished
		e.publish(t, e.nats.JS, logs, &pub)
		s, err := New(Config{Partitions: partition.All(e.n), PartitionCount: e.n, IdleWait: 200 * time.Millisecond, RelayPoll: 100 * time.Millisecond,
			BatchSize: map[bool]int{false: 1000, true: 1}[batchOne]},
			Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		e.waitCaughtUp(t, &pub, 30*time.Second)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		checkStateAgainstModel(t, e, &pub)

		got := map[string][]string{}
		for _, ev := range readStateEvents(t, e.nats.JS) {
			got[ev.SensorID] = append(got[ev.SensorID], ev.Type)
		}
		rows := loadStateRows(t, e.pg)
		for id, w := range want {
			if !slices.Equal(got[id], w) {
				t.Errorf("sensor %s: events %v, want %v", id, got[id], w)
			}
			if rows[id].Connection != conn[id] {
				t.Errorf("sensor %s: connection %q, want %q", id, rows[id].Connection, conn[id])
			}
		}
		if _, ok := rows["ghost"]; ok || len(got["ghost"]) > 0 {
			t.Errorf("a liveness fact of a sensor never heard from made a row or events: %v", got["ghost"])
		}
		envs = append(envs, e)
	}
	// Replaying the same log into a fresh database gives the same rows and events.
	compareStateEnvs(t, envs[0], envs[1])
}

// compareStateEnvs asserts two runs ended with the same sensor_state and the same events.
func compareStateEnvs(t *testing.T, a, b *stateEnv) {
	t.Helper()
	ra, rb := loadStateRows(t, a.pg), loadStateRows(t, b.pg)
	if len(ra) != len(rb) {
		t.Errorf("%d rows vs %d", len(ra), len(rb))
	}
	for id, r := range ra {
		if rb[id] != r {
			t.Errorf("sensor %s: %+v vs %+v", id, r, rb[id])
		}
	}
	ea, eb := readStateEvents(t, a.nats.JS), readStateEvents(t, b.nats.JS)
	key := func(x, y event.Event) int {
		if x.SensorID != y.SensorID {
			if x.SensorID < y.SensorID {
				return -1
			}
			return 1
		}
		return int(x.Revision - y.Revision)
	}
	slices.SortFunc(ea, key)
	slices.SortFunc(eb, key)
	if len(ea) != len(eb) {
		t.Fatalf("%d events vs %d", len(ea), len(eb))
	}
	for i := range ea {
		x, y := ea[i], eb[i]
		if x.ID != y.ID || x.Type != y.Type || x.Data != y.Data || !x.OccurredAt.Equal(y.OccurredAt) || x.Revision != y.Revision ||
			x.Seq != y.Seq || (x.PreviousData == nil) != (y.PreviousData == nil) || (x.PreviousData != nil && *x.PreviousData != *y.PreviousData) {
			t.Errorf("event %d: %+v vs %+v", i, x, y)
		}
	}
}

func TestStateSplitPartitions(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	ids := stateSensorIDs(r, 300)
	logs := stateRandomReadings(r, ids, 4000, 0.5, stateT0)
	// Liveness facts for a third of the sensors, some in time and some stale.
	end := logs[len(logs)-1].ReceivedTime
	for i, id := range ids {
		if i%3 == 0 {
			logs = append(logs, event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: id,
				ReceivedTime: end.Add(time.Duration(i%2) * time.Hour), Time: end, LostAfter: time.Hour})
		}
	}
	logs = append(logs, stateRandomReadings(r, ids[:50], 200, 0.5, end.Add(2*time.Hour))...)

	one, two := newStateEnv(t, 6), newStateEnv(t, 6)
	var pubOne, pubTwo statePublished
	one.publish(t, one.nats.JS, logs, &pubOne)
	two.publish(t, two.nats.JS, logs, &pubTwo)

	one.runState(t, one.nats.JS, partition.All(one.n))
	for i := range 2 {
		parts, err := partition.Parse(fmt.Sprintf("%d/2", i), two.n)
		if err != nil {
			t.Fatal(err)
		}
		// Each "process" on its own connection.
		two.runState(t, testenv.JetStream(t, two.nats.URL, fmt.Sprintf("state-%d", i)), parts)
	}
	one.waitCaughtUp(t, &pubOne, 60*time.Second)
	two.waitCaughtUp(t, &pubTwo, 60*time.Second)
	checkStateAgainstModel(t, one, &pubOne)
	compareStateEnvs(t, one, two)
	lost := 0
	for _, r := range loadStateRows(t, one.pg) {
		if r.Connection == "lost" {
			lost++
		}
	}
	if lost == 0 {
		t.Error("test data: no sensor ended lost")
	}
}

// A batch delivered again after its commit (its ack lost) changes nothing, with or without
// the row cache; and a cache never outlives a write it did not make.
func TestStateSkipsAppliedMessages(t *testing.T) {
	t.Parallel()
	type step struct {
		from, to int // messages [from, to)
		writer   int // which cache applies it (-1: none)
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"no cache", []step{{0, 150, -1}, {0, 300, -1}, {0, 300, -1}, {0, 10, -1}}},
		{"cache", []step{{0, 150, 0}, {0, 300, 0}, {0, 300, 0}, {0, 10, 0}}},
		{"two writers alternate", []step{{0, 100, 0}, {100, 200, 1}, {200, 250, 0}, {150, 300, 1}, {0, 300, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newStateEnv(t, 1)
			r := rand.New(rand.NewPCG(9, 10))
			var pub statePublished
			// Few sensors, so that every batch meets sensors the other writer changed.
			e.publish(t, e.nats.JS, stateRandomReadings(r, stateSensorIDs(r, 20), 300, 0.5, stateT0), &pub)
			c, err := e.nats.JS.CreateConsumer(t.Context(), natsx.ReadingsStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := logread.Drain(c.Fetch(300, jetstream.FetchMaxWait(5*time.Second)))
			if err != nil || len(msgs) != 300 {
				t.Fatalf("fetched %d messages: %v", len(msgs), err)
			}
			s, err := New(Config{Partitions: partition.All(1), PartitionCount: 1},
				Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			epoch, err := lease.Claim(t.Context(), e.pg, Name, 0, "test")
			if err != nil {
				t.Fatal(err)
			}
			caches := []*rowCache{newRowCache(1000), newRowCache(1000)}
			for _, st := range tc.steps {
				var c *rowCache
				if st.writer >= 0 {
					c = caches[st.writer]
				}
				if err := s.applyBatch(t.Context(), 0, epoch, msgs[st.from:st.to], c); err != nil {
					t.Fatal(err)
				}
			}
			m := buildStateModel(&pub, 1)
			var n int
			_ = e.pg.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&n)
			if n != m.total {
				t.Errorf("outbox has %d rows, want %d", n, m.total)
			}
			got := loadStateRows(t, e.pg)
			for id, want := range m.rows {
				if got[id] != *want {
					t.Errorf("sensor %s: %+v, want %+v", id, got[id], *want)
				}
			}
			if v := stateCounterValue(s.m.applied); v != 300 {
				t.Errorf("applied %v messages, want 300", v)
			}
		})
	}
}

func stateCounterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestStateConsumerInMemory: the partitions' READINGS consumers keep their state in memory
// (the checkpoint is Postgres's), so that NATS does not rewrite a state file for each of
// them ten times a second under load; TestStateNATSRestart shows one lost with a restart
// is recreated.
func TestStateConsumerInMemory(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	r := rand.New(rand.NewPCG(7, 8))
	var pub statePublished
	e.publish(t, e.nats.JS, stateRandomReadings(r, stateSensorIDs(r, 20), 200, 0.5, stateT0), &pub)
	stop := e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 30*time.Second)
	stop()
	for p := range e.n {
		c, err := e.nats.JS.Consumer(t.Context(), natsx.ReadingsStream, consumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		if !c.CachedInfo().Config.MemoryStorage {
			t.Errorf("consumer %s keeps its state on disk", consumerName(p))
		}
	}
}
