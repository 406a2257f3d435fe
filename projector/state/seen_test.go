package state

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
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
// change and repeats it otherwise. sent, when not nil, sees each chunk once it is stored,
// with its sequences.
func (e *stateEnv) publishLive(t testing.TB, pub *statePublished, r *rand.Rand, ids []string, last map[string]uint8, rate, count int, change float64, sent func([]event.Log, []uint64)) {
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
		e.publish(t, e.nats.JS, chunk, pub)
		if sent != nil {
			sent(chunk, pub.seqs[len(pub.seqs)-len(chunk):])
		}
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * every)))
	}
}

// Readings arriving live, most of them repeats: at any moment every sensor's row in
// Postgres holds the liveness of every reading of it the projector had applied (its
// checkpoint was past it) the bound before, however far the projector lags on this shared
// machine; far fewer rows are written than readings come; and once the readings stop the
// rows become exactly what the log says.
func TestStateSeenWithinBoundUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		bound = 2 * time.Second
		// slack covers the batch or flush that writes the rows (a batch decides at its
		// start) and the sampling, on a machine shared with other tests.
		slack   = time.Second
		rate    = 1000 // readings a second
		count   = 10 * rate
		sensors = 100
	)
	e := newStateEnv(t, 4)
	e.seen = bound
	e.runState(t, e.nats.JS, partition.All(e.n))
	r := rand.New(rand.NewPCG(26, 1))
	ids := stateSensorIDs(r, sensors)

	type sample struct {
		at   time.Time
		cps  map[int]uint64
		rows map[string]stateModelRow
	}
	var (
		mu      sync.Mutex
		seqs    = map[string][]uint64{}  // each sensor's readings' sequences, in order
		recv    = map[uint64]time.Time{} // receive time by sequence
		history []sample
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			// The rows first, then what the projector has applied (in memory too, beyond
			// the checkpoints): a reading that covers was applied by the time it was read,
			// and that time is the sample's.
			rows := loadStateRows(t, e.pg)
			cps := e.appliedSeqs(t)
			at := time.Now()
			mu.Lock()
			history = append(history, sample{at: at, cps: cps, rows: rows})
			mu.Unlock()
		}
	}()
	var pub statePublished
	e.publishLive(t, &pub, r, ids, map[string]uint8{}, rate, count, 0.05, func(logs []event.Log, s []uint64) {
		mu.Lock()
		for i, l := range logs {
			seqs[l.SensorID] = append(seqs[l.SensorID], s[i])
			recv[s[i]] = l.ReceivedTime
		}
		mu.Unlock()
	})
	close(stop)
	<-sampled
	e.waitCaughtUp(t, &pub, 60*time.Second)
	waitRowsExact(t, e, &pub, bound+slack)
	checkStateAgainstModel(t, e, &pub)

	// Each sample against the latest one at least the bound (and slack) before it.
	checked, bad, j := 0, 0, -1
	for _, cur := range history {
		for j+1 < len(history) && !history[j+1].at.After(cur.at.Add(-bound-slack)) {
			j++
		}
		if j < 0 {
			continue
		}
		before := history[j]
		checked++
		for id, ss := range seqs {
			p := partition.Of(id, e.n)
			var due uint64 // the newest reading of id applied by then
			for i := len(ss) - 1; i >= 0; i-- {
				if ss[i] <= before.cps[p] {
					due = ss[i]
					break
				}
			}
			row := cur.rows[id]
			if due > 0 && row.LastSeq < due {
				if bad++; bad <= 5 {
					t.Errorf("at %s sensor %s: last_seq %d (last_seen %s), but reading %d (received %s) was applied by %s",
						cur.at.Format(time.StampMilli), id, row.LastSeq, row.LastSeen.Format(time.StampMilli), due,
						recv[due].Format(time.StampMilli), before.at.Format(time.StampMilli))
				}
			}
		}
	}
	change, seen := e.rowsWritten(t)
	t.Logf("%d readings of %d sensors, %d samples checked: %d rows behind their bound; rows written: %.0f for changes, %.0f for liveness",
		len(pub.logs), sensors, checked, bad, change, seen)
	if checked < 10 {
		t.Errorf("only %d samples checked", checked)
	}
	if w := change + seen; w == 0 || w > 0.4*float64(len(pub.logs)) {
		t.Errorf("%.0f rows written for %d readings: want far fewer (coalesced)", w, len(pub.logs))
	}
	// Most batches change nothing but liveness here: those open no transaction.
	if v := stateCounterValueOf(t, e, "locks_state_applied_in_memory_total"); v == 0 {
		t.Error("no reading was applied in memory only")
	}
}

// appliedSeqs reads locks_state_applied_seq: the last sequence each partition applied,
// committed or in memory.
func (e *stateEnv) appliedSeqs(t *testing.T) map[int]uint64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Error(err)
		return nil
	}
	out := map[int]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "locks_state_applied_seq" {
			continue
		}
		for _, m := range mf.GetMetric() {
			p, _ := strconv.Atoi(m.GetLabel()[0].GetValue())
			out[p] = uint64(m.GetGauge().GetValue())
		}
	}
	return out
}

// Readings that only repeat their sensors' values open no transaction: the checkpoints and
// the rows stay as they were, with the readings applied in memory, until the pending
// liveness is due; then one transaction per partition writes the rows and moves the
// checkpoint past them all. A change among repeats is committed at once, its checkpoint
// covering the repeats before it.
func TestStateRepeatsOpenNoTransaction(t *testing.T) {
	t.Parallel()
	e, clk := newHeldStateEnv(t, 2)
	e.runState(t, e.nats.JS, partition.All(e.n))
	r := rand.New(rand.NewPCG(26, 3))
	ids := stateSensorIDs(r, 20)
	reading := heldReadings()
	var pub statePublished
	var first []event.Log
	for i, id := range ids {
		first = append(first, reading(id, 0, i))
	}
	e.publish(t, e.nats.JS, first, &pub)
	e.waitCaughtUp(t, &pub, 20*time.Second)
	transactions := func() uint64 { return e.commits(t) }
	before, rows := transactions(), loadStateRows(t, e.pg)
	cps := map[int]uint64{}
	for p, seq := range pub.maxSeq {
		cps[p] = seq
	}

	const repeats = 400
	var more []event.Log
	for k := range repeats {
		more = append(more, reading(ids[k%len(ids)], 0, len(ids)+k))
	}
	e.publish(t, e.nats.JS, more, &pub)
	for deadline := time.Now().Add(10 * time.Second); stateCounterValueOf(t, e, "locks_state_applied_in_memory_total") < repeats; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%.0f of %d repeats applied in memory after 10 s", stateCounterValueOf(t, e, "locks_state_applied_in_memory_total"), repeats)
		}
	}
	if got := e.appliedSeqs(t); got[0] != pub.maxSeq[0] || got[1] != pub.maxSeq[1] {
		t.Errorf("applied up to %v, want the last sequences %v", got, pub.maxSeq)
	}
	if n := transactions(); n != before {
		t.Errorf("%d transactions for readings that only repeat, want none", n-before)
	}
	for p, want := range cps {
		var seq int64
		if err := e.pg.QueryRow(t.Context(), `SELECT seq FROM checkpoints WHERE projection = 'state' AND partition = $1`, p).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		if uint64(seq) != want {
			t.Errorf("partition %d: checkpoint %d while the repeats wait in memory, want %d", p, seq, want)
		}
	}
	if !maps.Equal(loadStateRows(t, e.pg), rows) {
		t.Error("rows written while the repeats wait in memory")
	}

	// Due: one transaction per partition writes it all.
	clk.Add(e.seen)
	e.waitCaughtUp(t, &pub, 5*time.Second)
	waitRowsExact(t, e, &pub, 5*time.Second)
	// A transaction's commit is observed just after its rows show: wait for the last one.
	testenv.Eventually(t, 5*time.Second, "a commit per partition observed", func() bool { return transactions()-before >= uint64(e.n) })
	if n := transactions() - before; n != uint64(e.n) {
		t.Errorf("%d transactions wrote the pending liveness, want one per partition (%d)", n, e.n)
	}

	// A change among repeats is committed at once, the repeats before it with it.
	before = transactions()
	var mixed []event.Log
	for k := range 50 {
		mixed = append(mixed, reading(ids[k%len(ids)], 0, len(ids)+repeats+k))
	}
	mixed = append(mixed, reading(ids[0], 1, len(ids)+repeats+50))
	e.publish(t, e.nats.JS, mixed, &pub)
	p0 := partition.Of(ids[0], e.n)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var seq int64
		_ = e.pg.QueryRow(t.Context(), `SELECT seq FROM checkpoints WHERE projection = 'state' AND partition = $1`, p0).Scan(&seq)
		if uint64(seq) == pub.maxSeq[p0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition %d: checkpoint %d 5 s after a change at %d", p0, seq, pub.maxSeq[p0])
		}
	}
	// The changed row is written; its partition's repeats are still pending liveness.
	if got, want := loadStateRows(t, e.pg)[ids[0]], *buildStateModel(&pub, e.n).rows[ids[0]]; got != want {
		t.Errorf("sensor %s after its change: %+v, want %+v", ids[0], got, want)
	}
	testenv.Eventually(t, 5*time.Second, "the change's commit observed", func() bool { return transactions() > before })
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

// waitSeenWritten waits until no checkpoint has liveness pending: every row holds every
// reading its checkpoint covers.
func (e *stateEnv) waitSeenWritten(t *testing.T, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, "the pending liveness written", func() bool {
		var pending int
		if err := e.pg.QueryRow(t.Context(), `SELECT count(*) FROM checkpoints WHERE projection = 'state' AND seen_seq < seq`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
}

// newHeldStateEnv is a stateEnv whose liveness is not due on its own while a test looks (an
// interval of 20 s), on a clock the test moves ahead to make it due.
func newHeldStateEnv(t *testing.T, n int) (*stateEnv, *testenv.AheadClock) {
	t.Helper()
	e := newStateEnv(t, n)
	e.seen = 20 * time.Second
	clk := testenv.ClockAhead(0)
	e.clock = clk
	return e, clk
}

// heldReadings returns a maker of readings received now plus k ms, each with a message id of
// its own.
func heldReadings() func(id string, data uint8, k int) event.Log {
	at := time.Now().UTC().Truncate(time.Millisecond)
	return func(id string, data uint8, k int) event.Log {
		tm := at.Add(time.Duration(k) * time.Millisecond)
		return event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: data, Time: tm, ReceivedTime: tm,
			MessageID: id + "-" + strconv.Itoa(k)}
	}
}

// commits is how many transactions the projector committed (locks_state_commit_seconds).
func (e *stateEnv) commits(t *testing.T) uint64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "locks_state_commit_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
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

// Readings applied in memory only when NATS restarts stay applied in memory: the consumer
// resumes after them, no transaction applies them again, the readings after the restart
// join them, and a clean stop leaves the rows exactly as the log says, each reading counted
// once.
func TestStateRepeatsInMemoryAcrossNATSRestart(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	e.seen = time.Minute // never due within the test
	js := testenv.JetStream(t, e.nats.URL, "state")
	stop := e.runState(t, js, partition.All(e.n))
	r := rand.New(rand.NewPCG(26, 4))
	ids := stateSensorIDs(r, 20)
	var pub statePublished
	first := stateRandomReadings(r, ids, len(ids), 0, stateT0)
	for i := range first {
		first[i].SensorID = ids[i] // each sensor has its row before the repeats
	}
	e.publish(t, e.nats.JS, first, &pub)
	e.waitCaughtUp(t, &pub, 20*time.Second)
	repeats := stateRandomReadings(r, ids, 300, 1, stateT0.Add(time.Minute))
	for i := range repeats {
		repeats[i].Data = first[slices.Index(ids, repeats[i].SensorID)].Data
	}
	e.publish(t, e.nats.JS, repeats, &pub)
	for deadline := time.Now().Add(10 * time.Second); stateCounterValueOf(t, e, "locks_state_applied_in_memory_total") < 300; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%.0f of 300 repeats applied in memory after 10 s", stateCounterValueOf(t, e, "locks_state_applied_in_memory_total"))
		}
	}
	before := e.commits(t)
	e.nats.Restart(500 * time.Millisecond)
	more := stateRandomReadings(r, ids, 20, 1, stateT0.Add(2*time.Minute))
	for i := range more {
		more[i].Data = first[slices.Index(ids, more[i].SensorID)].Data
	}
	e.publish(t, e.nats.JS, more, &pub)
	testenv.Eventually(t, 20*time.Second, "the readings after the restart applied", func() bool {
		got := e.appliedSeqs(t)
		return got[0] == pub.maxSeq[0] && got[1] == pub.maxSeq[1]
	})
	if n := e.commits(t) - before; n != 0 {
		t.Errorf("%d transactions after the restart, want none: nothing but liveness came", n)
	}
	stop()
	checkStateAgainstModel(t, e, &pub)
	if v := stateCounterValueOf(t, e, "locks_state_applied_total"); v != float64(len(pub.logs)) {
		t.Errorf("locks_state_applied_total %.0f, want %d: the readings applied again after the restart counted twice", v, len(pub.logs))
	}
}
