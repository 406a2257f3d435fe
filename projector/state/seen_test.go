package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// rowsDiffer lists (up to 5) the sensors whose rows are not what the model says, and how
// many differ.
func rowsDiffer(got map[string]stateModelRow, m stateModel, only map[string]bool) (int, []string) {
	n := 0
	var out []string
	for id, want := range m.rows {
		if only != nil && !only[id] {
			continue
		}
		if g, ok := got[id]; !ok || g != *want {
			if n++; n <= 5 {
				out = append(out, fmt.Sprintf("%s: %+v, want %+v", id, g, *want))
			}
		}
	}
	return n, out
}

// waitRowsExact waits until sensor_state is exactly the model.
func waitRowsExact(t *testing.T, e *stateEnv, pub *statePublished, within time.Duration) {
	t.Helper()
	m := buildStateModel(pub, e.n)
	deadline := time.Now().Add(within)
	for {
		n, diff := rowsDiffer(loadStateRows(t, e.pg), m, nil)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still differ from the model %s after catching up: %v", n, within, diff)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *stateEnv) rowsWritten(t *testing.T) (change, seen float64) {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "locks_state_rows_written_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch m.GetLabel()[0].GetValue() {
			case "change":
				change = m.GetCounter().GetValue()
			case "seen":
				seen = m.GetCounter().GetValue()
			}
		}
	}
	return change, seen
}

// publishLive publishes count readings of ids into pub at up to rate a second, received
// when they are published: each flips its sensor's value (last, updated) with probability
// change and repeats it otherwise. sent, when not nil, sees each chunk before it is published.
func (e *stateEnv) publishLive(t testing.TB, pub *statePublished, r *rand.Rand, ids []string, last map[string]uint8, rate, count int, change float64, sent func([]event.Log)) {
	t.Helper()
	const every = 20 * time.Millisecond
	start := time.Now()
	for i, done := 0, 0; done < count; i++ {
		chunk := make([]event.Log, min(count-done, max(1, rate*int(every/time.Millisecond)/1000)))
		done += len(chunk)
		for j := range chunk {
			id := ids[r.IntN(len(ids))]
			d, ok := last[id]
			if !ok {
				d = uint8(r.IntN(2))
			} else if r.Float64() < change {
				d = 1 - d
			}
			last[id] = d
			now := time.Now().UTC().Truncate(time.Microsecond).Add(time.Duration(j) * time.Microsecond)
			chunk[j] = event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d, Time: now, ReceivedTime: now,
				MessageID: "live" + strconv.Itoa(len(pub.logs)+j)}
		}
		if sent != nil {
			sent(chunk)
		}
		e.publish(t, e.nats.JS, chunk, pub)
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * every)))
	}
}

// Readings arriving live, most of them repeats: at any moment every sensor's last_seen in
// Postgres is at least the receive time of its readings older than the bound (plus the
// pipeline's slack), far fewer rows are written than readings come, and once the readings
// stop the rows become exactly what the log says.
func TestStateSeenWithinBoundUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		bound = time.Second
		// slack is what the projector may lag behind a reading on this shared machine.
		slack   = time.Second
		rate    = 1000 // readings a second
		runFor  = 8 * time.Second
		sensors = 100
	)
	e := newStateEnv(t, 4)
	e.seen = bound
	e.runState(t, e.nats.JS, partition.All(e.n))
	r := rand.New(rand.NewPCG(26, 1))
	ids := stateSensorIDs(r, sensors)

	var mu sync.Mutex
	sent := map[string][]time.Time{} // receive times per sensor, in order
	var violations []string
	var worst time.Duration
	samples := 0
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			t0 := time.Now()
			rows := loadStateRows(t, e.pg)
			mu.Lock()
			samples++
			for id, times := range sent {
				// The newest reading received before the bound and slack: it must show.
				var due, newest time.Time
				for i := len(times) - 1; i >= 0; i-- {
					if newest.IsZero() && !times[i].After(t0) {
						newest = times[i]
					}
					if !times[i].After(t0.Add(-bound - slack)) {
						due = times[i]
						break
					}
				}
				seen := rows[id].LastSeen
				if !newest.IsZero() && !seen.IsZero() {
					worst = max(worst, newest.Sub(seen))
				}
				if !due.IsZero() && seen.Before(due) && len(violations) < 5 {
					violations = append(violations, fmt.Sprintf("at %s sensor %s: last_seen %s, a reading received %s", t0.Format(time.StampMicro),
						id, seen.Format(time.StampMicro), due.Format(time.StampMicro)))
				}
			}
			mu.Unlock()
		}
	}()

	var pub statePublished
	e.publishLive(t, &pub, r, ids, map[string]uint8{}, rate, int(runFor/time.Second)*rate, 0.05, func(chunk []event.Log) {
		mu.Lock()
		for _, l := range chunk {
			sent[l.SensorID] = append(sent[l.SensorID], l.ReceivedTime)
		}
		mu.Unlock()
	})
	close(stop)
	<-sampled
	e.waitCaughtUp(t, &pub, 60*time.Second)
	waitRowsExact(t, e, &pub, bound+slack)
	checkStateAgainstModel(t, e, &pub)

	change, seen := e.rowsWritten(t)
	t.Logf("%d readings of %d sensors in %s, %d samples: the newest last_seen lagged the newest reading by at most %s; rows written: %.0f for changes, %.0f for liveness",
		len(pub.logs), sensors, runFor, samples, worst, change, seen)
	if samples < 10 {
		t.Errorf("only %d samples", samples)
	}
	for _, v := range violations {
		t.Errorf("last_seen older than the bound %s (+%s slack): %s", bound, slack, v)
	}
	if w := change + seen; w == 0 || w > 0.4*float64(len(pub.logs)) {
		t.Errorf("%.0f rows written for %d readings: want far fewer (coalesced)", w, len(pub.logs))
	}
}

// The process is killed while liveness is deferred (an interval longer than the test): what
// it held in memory is gone, and its successor replays it from READINGS before anything
// else, exactly.
func TestStateSeenExactAfterCrash(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	r := rand.New(rand.NewPCG(26, 2))
	// Early sensors send their first reading, then (in later batches) a few of the same
	// value, and then nothing: those are applied before the crash and wait in memory when
	// it comes.
	const early = 50
	isEarly := map[string]bool{}
	round := func(k int) (out []event.Log) {
		for i := range early {
			id := "early" + strconv.Itoa(i)
			isEarly[id] = true
			at := stateT0.Add(time.Duration(k)*time.Minute + time.Duration(i)*time.Millisecond)
			out = append(out, event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: uint8(i % 2),
				Time: at, ReceivedTime: at, MessageID: id + "-" + strconv.Itoa(k)})
		}
		return out
	}
	busy := stateSensorIDs(r, 300)
	logs := round(0)
	logs = append(logs, stateRandomReadings(r, busy, 2000, 0.9, stateT0.Add(time.Second))...)
	for k := 1; k < 4; k++ {
		logs = append(logs, round(k)...)
	}
	logs = append(logs, stateRandomReadings(r, busy, 4000, 0.9, stateT0.Add(10*time.Minute))...)
	var pub statePublished
	e.publish(t, e.nats.JS, logs, &pub)
	m := buildStateModel(&pub, e.n)

	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperStateProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCKS_TEST_STATE_CHILD=1", crashpoint.Env+"="+CrashAfterCommit+":60", "LOCKS_TEST_SEEN_INTERVAL=1m", "LOCKS_TEST_BATCH=100",
		"LOCKS_TEST_NATS_URL="+e.nats.URL, "LOCKS_TEST_PG_URL="+e.pgURL, "LOCKS_TEST_PARTITIONS="+strconv.Itoa(e.n))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child: %v, want exit code %d; output:\n%s", err, crashpoint.ExitCode, out)
	}
	// What the crash left: early sensors whose last readings were applied before it (at or
	// below their partition's checkpoint) but whose rows miss them, and the checkpoints
	// saying from where.
	cps := map[int]uint64{}
	if err := func() error {
		rows, err := e.pg.Query(t.Context(), `SELECT partition, seq FROM checkpoints WHERE projection = 'state'`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var p int
			var seq int64
			if err := rows.Scan(&p, &seq); err != nil {
				return err
			}
			cps[p] = uint64(seq)
		}
		return rows.Err()
	}(); err != nil {
		t.Fatal(err)
	}
	applied := map[string]bool{}
	for id := range isEarly {
		applied[id] = m.rows[id].LastSeq <= cps[m.rows[id].Partition]
	}
	for id, ok := range applied {
		if !ok {
			delete(applied, id)
		}
	}
	stale, _ := rowsDiffer(loadStateRows(t, e.pg), m, applied)
	var pending int
	if err := e.pg.QueryRow(t.Context(), `SELECT count(*) FROM checkpoints WHERE projection = 'state' AND seen_seq < seq`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if stale == 0 || pending == 0 {
		t.Fatalf("after the crash: %d early sensors' rows behind the log, %d checkpoints with liveness pending: want some of each", stale, pending)
	}

	e.seen = time.Minute
	stop := e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	// Nothing of these sensors came after the crash: only the replay, at start, can have
	// written their last readings.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, diff := rowsDiffer(loadStateRows(t, e.pg), m, applied)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the restart caught up, %d of the %d early sensors that were behind still differ: %v", n, stale, diff)
		}
	}
	t.Logf("the crash left %d of %d early sensors behind the log; the restart replayed them", stale, len(applied))
	if v := stateCounterValueOf(t, e, "locks_state_seen_replayed_total"); v < float64(stale) {
		t.Errorf("locks_state_seen_replayed_total %.0f, want at least %d", v, stale)
	}
	// A clean stop writes what is pending.
	stop()
	checkStateAgainstModel(t, e, &pub)
	if err := e.pg.QueryRow(t.Context(), `SELECT count(*) FROM checkpoints WHERE projection = 'state' AND seen_seq IS NOT NULL`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != 0 {
		t.Errorf("after a clean stop %d checkpoints still have liveness pending", pending)
	}
}

func stateCounterValueOf(t *testing.T, e *stateEnv, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A rebuild while liveness is deferred swaps in rows that are exactly the log's, and the live
// projector goes on on them without writing its forgotten pending rows over them.
func TestStateSeenRebuild(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	e.seen = time.Minute
	var pub statePublished
	e.publish(t, e.nats.JS, rebuildLog(26, 500, 10000), &pub)
	stop := e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 90*time.Second)
	m := buildStateModel(&pub, e.n)
	if n, _ := rowsDiffer(loadStateRows(t, e.pg), m, nil); n == 0 {
		t.Fatal("every row is exact before the rebuild: want liveness pending, for the rebuild to have something to show")
	}

	res, err := e.newRebuild(t, RebuildConfig{BatchSize: 1000}).Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res)
	if n, diff := rowsDiffer(loadStateRows(t, e.pg), m, nil); n > 0 {
		t.Errorf("after the rebuild %d rows differ from the log: %v", n, diff)
	}

	more := stateRandomReadings(rand.New(rand.NewPCG(26, 3)), stateSensorIDs(rand.New(rand.NewPCG(26, 4)), 100), 2000, 0.9, stateT0.Add(48*time.Hour))
	e.publish(t, e.nats.JS, more, &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)
	m = buildStateModel(&pub, e.n)
	// The sensors of the first log that sent nothing since are exact already.
	quiet := map[string]bool{}
	for id := range m.rows {
		quiet[id] = true
	}
	for _, l := range more {
		delete(quiet, l.SensorID)
	}
	if n, diff := rowsDiffer(loadStateRows(t, e.pg), m, quiet); n > 0 {
		t.Errorf("after the rebuild and more readings, %d rows of quiet sensors differ: %v", n, diff)
	}
	stop()
	checkStateAgainstModel(t, e, &pub)
}
