package state

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

func stateBenchInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkStateProjector times the state projector applying a READINGS stream that is
// already full: 1,000,000 readings over 100,000 sensors in 16 partitions (change them with
// LOCKS_BENCH_STATE_READINGS and LOCKS_BENCH_STATE_SENSORS; LOCKS_BENCH_STATE_BATCH sets the
// batch size, LOCKS_BENCH_STATE_PG_CONNS the Postgres pool size, default pgxpool's 4 on 2 cores). A sensor's reading repeats its
// last value 90% of the time (door sensors report far more often than doors move), so about
// a fifth of the readings make an event. It reports readings/s until every checkpoint is at
// the end of its partition, and events/s until the relay has emptied the outbox as well.
func BenchmarkStateProjector(b *testing.B) {
	readings := stateBenchInt("LOCKS_BENCH_STATE_READINGS", 1_000_000)
	sensors := stateBenchInt("LOCKS_BENCH_STATE_SENSORS", 100_000)
	for range b.N {
		b.StopTimer()
		e := newStateEnv(b, 16)
		e.batch = stateBenchInt("LOCKS_BENCH_STATE_BATCH", 0)
		if conns := stateBenchInt("LOCKS_BENCH_STATE_PG_CONNS", 0); conns > 0 {
			// pgxpool reads pool_max_conns from the URL, as LOCKS_POSTGRES_URL would carry it.
			pool, err := pgxpool.New(b.Context(), e.pgURL+"&pool_max_conns="+strconv.Itoa(conns))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			e.pg = pool
		}
		r := rand.New(rand.NewPCG(11, 12))
		logs := stateRandomReadings(r, stateSensorIDs(r, sensors), readings, 0.8, stateT0)
		var pub statePublished
		setup := time.Now()
		e.publish(b, e.nats.JS, logs, &pub)
		b.Logf("published %d readings over %d sensors in %s", readings, sensors, time.Since(setup).Round(time.Millisecond))
		m := buildStateModel(&pub, e.n)
		events := m.total
		// The readings are in READINGS now: drop them, so that the collector of this process
		// (which also runs the embedded NATS server) does not scan them while timing.
		logs, pub.logs = nil, nil
		runtime.GC()

		b.StartTimer()
		start := time.Now()
		stop := e.runState(b, e.nats.JS, partition.All(e.n))
		for !e.checkpointsAt(b, &pub) {
			time.Sleep(20 * time.Millisecond)
		}
		applied := time.Since(start)
		e.waitCaughtUp(b, &pub, 10*time.Minute)
		relayed := time.Since(start)
		b.StopTimer()
		stop()

		b.ReportMetric(float64(readings)/applied.Seconds(), "readings/s")
		b.ReportMetric(float64(events)/relayed.Seconds(), "events/s")
		b.Logf("applied %d readings in %s; %d events in EVENTS after %s", readings, applied.Round(time.Millisecond),
			events, relayed.Round(time.Millisecond))
		if mfs, err := e.reg.Gather(); err == nil {
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					if h := m.GetHistogram(); h != nil && h.GetSampleCount() > 0 {
						b.Logf("%s: %d samples, mean %.4f", mf.GetName(), h.GetSampleCount(), h.GetSampleSum()/float64(h.GetSampleCount()))
					}
				}
			}
		}
		if b.N == 1 {
			checkStateAgainst(b, e, m)
		}
	}
}

// checkpointsAt says whether every partition's checkpoint is at its last sequence.
func (e *stateEnv) checkpointsAt(t testing.TB, pub *statePublished) bool {
	rows, err := e.pg.Query(t.Context(), `SELECT partition, seq FROM checkpoints WHERE projection = 'state'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	at := 0
	for rows.Next() {
		var p int
		var seq int64
		if err := rows.Scan(&p, &seq); err != nil {
			t.Fatal(err)
		}
		if uint64(seq) >= pub.maxSeq[p] {
			at++
		}
	}
	return at == len(pub.maxSeq)
}

// BenchmarkStateSeenRowWrites counts the sensor_state row writes (Postgres' n_tup_upd and
// n_tup_ins over its partitions) per reading, with every reading written (seen=0) and with
// liveness coalesced (seen=5s, the default): after a first reading of every sensor (not
// counted), 20,000 readings published live at 2,000/s over 2,000 sensors, 5% of them
// changing their sensor's value (LOCKS_BENCH_SEEN_READINGS, _RATE and _SENSORS change them).
func BenchmarkStateSeenRowWrites(b *testing.B) {
	readings := stateBenchInt("LOCKS_BENCH_SEEN_READINGS", 20_000)
	rate := stateBenchInt("LOCKS_BENCH_SEEN_RATE", 2_000)
	sensors := stateBenchInt("LOCKS_BENCH_SEEN_SENSORS", 2_000)
	for _, seen := range []time.Duration{0, SeenIntervalDefault} {
		b.Run("seen="+seen.String(), func(b *testing.B) {
			for range b.N {
				e := newStateEnv(b, 16)
				e.seen = seen
				stop := e.runState(b, e.nats.JS, partition.All(e.n))
				r := rand.New(rand.NewPCG(26, 26))
				ids := stateSensorIDs(r, sensors)
				last := map[string]uint8{}
				var pub statePublished
				now := time.Now().UTC().Truncate(time.Microsecond)
				firsts := make([]event.Log, len(ids))
				for i, id := range ids {
					last[id] = uint8(r.IntN(2))
					at := now.Add(time.Duration(i) * time.Microsecond)
					firsts[i] = event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: last[id], Time: at, ReceivedTime: at,
						MessageID: "first-" + id}
				}
				e.publish(b, e.nats.JS, firsts, &pub)
				e.waitCaughtUp(b, &pub, 2*time.Minute)
				upd0, ins0 := e.stateTupleWrites(b)
				first := len(pub.logs)
				e.publishLive(b, &pub, r, ids, last, rate, readings, 0.05, nil)
				e.waitCaughtUp(b, &pub, 2*time.Minute)
				stop() // writes what is pending
				m := buildStateModel(&pub, e.n)
				checkStateAgainst(b, e, m)
				upd, ins := e.stateTupleWrites(b)
				upd, ins = upd-upd0, ins-ins0
				n := float64(len(pub.logs) - first)
				b.ReportMetric(float64(upd)/n, "updates/reading")
				b.ReportMetric(float64(upd+ins)/n, "rows/reading")
				b.Logf("seen=%s: %d readings of %d sensors at %d/s (after %d first), %d events in all (%d changes): %d sensor_state updates, %d inserts",
					seen, len(pub.logs)-first, sensors, rate, first, m.total, m.total-len(m.rows), upd, ins)
			}
		})
	}
}

// stateTupleWrites reads Postgres' counts of rows updated and inserted in sensor_state's
// partitions, once every backend has reported them (within a second of its last transaction).
func (e *stateEnv) stateTupleWrites(b testing.TB) (upd, ins int64) {
	time.Sleep(2 * time.Second)
	if err := e.pg.QueryRow(b.Context(), `SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_ins), 0)
		FROM pg_stat_user_tables WHERE relname LIKE 'sensor\_state\_p%'`).Scan(&upd, &ins); err != nil {
		b.Fatal(err)
	}
	return upd, ins
}
