package state

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// rebuildLog is count random readings of sensors, then liveness facts that find a tenth of
// them silent for long enough (lost), then readings of half of those (restored, some changed),
// and the hand-written liveness script.
func rebuildLog(seed uint64, sensors, count int) []event.Log {
	r := rand.New(rand.NewPCG(seed, 7))
	ids := stateSensorIDs(r, sensors)
	script, _, _ := stateLivenessScript()
	t0 := stateT0.Add(24 * time.Hour)
	logs := append([]event.Log{}, script...)
	logs = append(logs, stateRandomReadings(r, ids, count, 0.7, t0)...)
	end := t0.Add(time.Duration(count) * time.Millisecond)
	for i, id := range ids[:sensors/10] {
		at := end.Add(2*time.Hour + time.Duration(i)*time.Microsecond)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindLivenessTimeout, SensorID: id, ReceivedTime: at, Time: at, LostAfter: time.Hour})
	}
	for i, id := range ids[:sensors/20] {
		at := end.Add(3*time.Hour + time.Duration(i)*time.Microsecond)
		logs = append(logs, event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: uint8(i % 2), Time: at, ReceivedTime: at,
			MessageID: "back/" + id})
	}
	return logs
}

func loadStateTable(t testing.TB, e *stateEnv, table string) map[string]stateModelRow {
	t.Helper()
	return loadStateRowsFrom(t, e.pg, table)
}

// equalRows fails the test on any difference between two tables' rows.
func equalRows(t testing.TB, what string, got, want map[string]stateModelRow) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d rows, want %d", what, len(got), len(want))
	}
	bad := 0
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			if bad++; bad <= 5 {
				t.Errorf("%s: sensor %s: %+v, want %+v", what, id, g, w)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d rows differ", what, bad)
	}
}

func eventsLastSeq(t testing.TB, e *stateEnv) uint64 {
	t.Helper()
	s, err := logread.StreamState(t.Context(), e.nats.JS, natsx.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	return s.LastSeq
}

func (e *stateEnv) newRebuild(t testing.TB, cfg RebuildConfig) *Rebuild {
	t.Helper()
	cfg.PartitionCount = e.n
	r, err := NewRebuild(cfg, RebuildDeps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// afterRebuild asserts the shadow and its checkpoints are gone and exactly one old table is kept.
func afterRebuild(t testing.TB, e *stateEnv, res rebuild.Result) {
	t.Helper()
	var shadow bool
	var cps int
	if err := e.pg.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL, (SELECT count(*) FROM checkpoints WHERE projection = $2)`,
		ShadowTable, ShadowName).Scan(&shadow, &cps); err != nil {
		t.Fatal(err)
	}
	if shadow || cps != 0 {
		t.Errorf("after the swap: shadow table left %v, %d rebuild checkpoints left", shadow, cps)
	}
	if !strings.HasPrefix(res.OldTable, OldTablePrefix) {
		t.Errorf("old table %q", res.OldTable)
	}
	// The swapped-in table is partitioned as migration 00070 made sensor_state, under the
	// names the migration gave, so that the next rebuild's shadow finds them free, and its
	// partitions keep their storage settings (00070's fillfactor, 00190's autovacuum
	// thresholds).
	var key, parts, shadowNamed string
	if err := e.pg.QueryRow(t.Context(), `SELECT coalesce(pg_get_partkeydef('sensor_state'::regclass), ''),
			coalesce((SELECT string_agg(c.relname || ' ' || pg_get_expr(c.relpartbound, c.oid) || ' ' || array_to_string(c.reloptions, ','), '; ' ORDER BY c.relname)
				FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'sensor_state'::regclass), ''),
			coalesce((SELECT string_agg(c.relname, ' ') FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
				WHERE c.relname LIKE '%rebuild%' AND x.indrelid IN
					(SELECT 'sensor_state'::regclass UNION SELECT inhrelid FROM pg_inherits WHERE inhparent = 'sensor_state'::regclass)), '')`).Scan(&key, &parts, &shadowNamed); err != nil {
		t.Fatal(err)
	}
	const opts = "fillfactor=70,autovacuum_vacuum_threshold=5000,autovacuum_analyze_threshold=5000"
	if key != "HASH (sensor_id)" || !strings.HasPrefix(parts, "sensor_state_p00 FOR VALUES WITH (modulus 16, remainder 0) "+opts+"; sensor_state_p01 ") ||
		strings.Count(parts, opts) != 16 || strings.Contains(parts, "rebuild") || shadowNamed != "" {
		t.Errorf("sensor_state after the swap: partitioned by %q, partitions %q, indexes with the shadow's names %q", key, parts, shadowNamed)
	}
}

// rebuildContinues runs the rebuild again after an interrupted one (the run) and asserts it
// continued the shadow of the readings log and ended equal to the live rows (rebuilt how).
func rebuildContinues(t testing.TB, e *stateEnv, readings int, live map[string]stateModelRow, run, how string) {
	t.Helper()
	res, err := e.newRebuild(t, RebuildConfig{BatchSize: 500}).Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res)
	if !res.Resumed || res.Applied == 0 || res.Applied >= uint64(readings) {
		t.Errorf("%s %+v: want it to continue the shadow (%d readings in all)", run, res, readings)
	}
	equalRows(t, "sensor_state rebuilt "+how+" vs the live one", loadStateTable(t, e, "sensor_state"), live)
}

func TestStateRebuildEqualsLive(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	var pub statePublished
	e.publish(t, e.nats.JS, rebuildLog(1, 1000, 20000), &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 90*time.Second)
	m := buildStateModel(&pub, e.n)
	lost := 0
	for _, r := range m.rows {
		if r.Connection == "lost" {
			lost++
		}
	}
	if lost < 20 || m.total < 2000 {
		t.Fatalf("test data: %d lost sensors, %d events: want liveness facts and changes", lost, m.total)
	}
	live := loadStateTable(t, e, "sensor_state")
	evsBefore := eventsLastSeq(t, e)

	res, err := e.newRebuild(t, RebuildConfig{BatchSize: 1000}).Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res)
	if res.Resumed || res.Applied != uint64(len(pub.logs)) || res.EventsChecked != m.total {
		t.Errorf("result %+v: want %d applied, %d events checked", res, len(pub.logs), m.total)
	}
	equalRows(t, "rebuilt sensor_state vs the live one before the rebuild", loadStateTable(t, e, "sensor_state"), live)
	equalRows(t, "the kept old table vs the live one before the rebuild", loadStateTable(t, e, res.OldTable), live)

	// The live projector goes on on the swapped-in table.
	more := stateRandomReadings(rand.New(rand.NewPCG(9, 9)), stateSensorIDs(rand.New(rand.NewPCG(1, 7)), 1000)[:200], 2000, 0.5, stateT0.Add(48*time.Hour))
	evsMid := eventsLastSeq(t, e)
	if evsMid != evsBefore {
		t.Errorf("EVENTS went from seq %d to %d during the rebuild, with nothing ingested", evsBefore, evsMid)
	}
	e.publish(t, e.nats.JS, more, &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)
	checkStateAgainstModel(t, e, &pub)

	// A second rebuild over the swapped-in table (its indexes renamed from the first shadow's).
	res2, err := e.newRebuild(t, RebuildConfig{}).Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res2)
	checkStateAgainstModel(t, e, &pub)

	dropped, err := DropOld(t.Context(), e.pg)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 2 || dropped[0] != res.OldTable || dropped[1] != res2.OldTable {
		t.Errorf("dropped %v, want [%s %s]", dropped, res.OldTable, res2.OldTable)
	}
}

func TestStateRebuildWhileIngesting(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	logs := rebuildLog(2, 800, 30000)
	var pub statePublished
	e.publish(t, e.nats.JS, logs[:12000], &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 90*time.Second)

	// Ingest the rest in small steps while the rebuild runs.
	var pub2 statePublished
	pub2.maxSeq = map[int]uint64{}
	ingested := make(chan struct{})
	var sent atomic.Int64
	r := e.newRebuild(t, RebuildConfig{BatchSize: 300, SwapTail: 2000})
	go func() {
		defer close(ingested)
		for i := 12000; i < len(logs); i += 200 {
			end := min(i+200, len(logs))
			e.publish(t, e.nats.JS, logs[i:end], &pub2)
			sent.Store(int64(end - 12000))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	res, err := r.Run(t.Context())
	atEnd := sent.Load()
	if err != nil {
		t.Fatal(err)
	}
	afterRebuild(t, e, res)
	<-ingested
	t.Logf("rebuild: %+v; readings ingested during it: %d of %d", res, atEnd, len(logs)-12000)
	if atEnd == 0 {
		t.Error("nothing was ingested during the rebuild: the test shows nothing")
	}
	pub.logs, pub.seqs = append(pub.logs, pub2.logs...), append(pub.seqs, pub2.seqs...)
	for p, s := range pub2.maxSeq {
		pub.maxSeq[p] = max(pub.maxSeq[p], s)
	}
	e.waitCaughtUp(t, &pub, 90*time.Second)
	// Every reading, before, during and after the rebuild, in the rows; every event once.
	checkStateAgainstModel(t, e, &pub)
}

// A swap that cannot take a live checkpoint's lock in time (or loses a deadlock to a live
// batch) rolls its tail back; the rebuild catches up again from the committed shadow and
// swaps, without applying the tail twice.
func TestStateRebuildSwapRetriesAfterLockConflict(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 3)
	logs := rebuildLog(6, 300, 6000)
	var pub statePublished
	e.publish(t, e.nats.JS, logs[:5000], &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)

	// sensor_state is read by a transaction that stays open, as a live batch that parsed
	// its statements before it waits for its checkpoint does: the swap applies the whole
	// log as its tail (SwapTail), then cannot rename the table.
	holder, err := e.pg.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.WithoutCancel(t.Context()))
	if _, err := holder.Exec(t.Context(), `SELECT count(*) FROM sensor_state`); err != nil {
		t.Fatal(err)
	}
	r := e.newRebuild(t, RebuildConfig{BatchSize: 400, SwapTail: 1 << 40, LockTimeout: 300 * time.Millisecond})
	var failures []error
	r.swapFailed = func(err error) {
		failures = append(failures, err)
		if len(failures) == 1 {
			// Readings that came meanwhile, for the second catch-up; then the lock goes.
			if err := holder.Rollback(t.Context()); err != nil {
				t.Error(err)
			}
			e.publish(t, e.nats.JS, logs[5000:], &pub)
			e.waitCaughtUp(t, &pub, 60*time.Second)
		}
	}
	res, err := r.Run(t.Context())
	if err != nil {
		t.Fatalf("rebuild: %v (swap failures: %v)", err, failures)
	}
	if len(failures) != 1 || !lockConflict(failures[0]) || !strings.Contains(failures[0].Error(), "RENAME") {
		t.Fatalf("swap failures %v, want one lock timeout at the rename", failures)
	}
	afterRebuild(t, e, res)
	if res.Applied != uint64(len(logs)) {
		t.Errorf("applied %d readings, want %d: a rolled-back tail was counted or applied twice", res.Applied, len(logs))
	}
	checkStateAgainstModel(t, e, &pub)
}

func TestStateRebuildResumes(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	var pub statePublished
	e.publish(t, e.nats.JS, rebuildLog(3, 500, 20000), &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 90*time.Second)
	live := loadStateTable(t, e, "sensor_state")
	evsBefore := eventsLastSeq(t, e)

	// Stopped after 20 of about 40 batches.
	ctx, cancel := context.WithCancel(t.Context())
	r := e.newRebuild(t, RebuildConfig{BatchSize: 500})
	var batches atomic.Int64
	r.afterBatch = func() {
		if batches.Add(1) == 20 {
			cancel()
		}
	}
	if _, err := r.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped rebuild: %v, want context.Canceled", err)
	}
	var done int64
	if err := e.pg.QueryRow(t.Context(), `SELECT coalesce(sum(seq), 0) FROM checkpoints WHERE projection = $1`, ShadowName).Scan(&done); err != nil {
		t.Fatal(err)
	}
	shadow := loadStateTable(t, e, ShadowTable)
	if done == 0 || len(shadow) == 0 {
		t.Fatalf("a stopped rebuild left no shadow (%d rows, checkpoints sum %d)", len(shadow), done)
	}
	equalRows(t, "live sensor_state after a stopped rebuild", loadStateTable(t, e, "sensor_state"), live)

	rebuildContinues(t, e, len(pub.logs), live, "second run", "in two runs")
	if got := eventsLastSeq(t, e); got != evsBefore {
		t.Errorf("EVENTS went from seq %d to %d during the rebuilds", evsBefore, got)
	}
	checkStateAgainstModel(t, e, &pub)
}

// An event already published under an id with other content fails the rebuild, which then
// swaps nothing.
func TestStateRebuildEventMismatch(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	logs := rebuildLog(4, 100, 2000)
	var pub statePublished
	e.publish(t, e.nats.JS, logs, &pub)
	stop := e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	stop()
	// A forged next event of a sensor, then the reading that makes the projector derive it:
	// the relay's publish is de-duplicated against the forgery.
	m := buildStateModel(&pub, e.n)
	id := logs[len(logs)-1].SensorID
	row := m.rows[id]
	forged := event.Event{V: event.Version, ID: event.ID(id, row.Revision+1), Type: event.TypeStateChanged, SensorID: id,
		Data: 1 - row.Data, Revision: row.Revision + 1, Partition: row.Partition, OccurredAt: stateT0, Seq: 1}
	body, err := json.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.nats.JS.PublishMsg(t.Context(), &nats.Msg{Subject: natsx.EventsSubject(row.Partition, id), Data: body},
		jetstream.WithMsgID(forged.ID)); err != nil {
		t.Fatal(err)
	}
	at := stateT0.Add(100 * time.Hour)
	e.publish(t, e.nats.JS, []event.Log{{V: event.Version, Kind: event.KindReading, SensorID: id, Data: 1 - row.Data, Time: at, ReceivedTime: at, MessageID: "flip"}}, &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	live := loadStateTable(t, e, "sensor_state")

	_, err = e.newRebuild(t, RebuildConfig{}).Run(t.Context())
	if !errors.Is(err, ErrEventMismatch) || !strings.Contains(err.Error(), forged.ID) {
		t.Fatalf("rebuild over a forged event: %v, want ErrEventMismatch naming %s", err, forged.ID)
	}
	equalRows(t, "live sensor_state after a failed rebuild", loadStateTable(t, e, "sensor_state"), live)
}

func TestStateRebuildRefusesTruncatedLog(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 2)
	var pub statePublished
	e.publish(t, e.nats.JS, rebuildLog(5, 50, 500), &pub)
	st, err := e.nats.JS.Stream(t.Context(), natsx.ReadingsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(t.Context(), jetstream.WithPurgeSequence(100)); err != nil {
		t.Fatal(err)
	}
	_, err = e.newRebuild(t, RebuildConfig{}).Run(t.Context())
	if !errors.Is(err, rebuild.ErrLogTruncated) {
		t.Fatalf("rebuild of a log without its start: %v, want rebuild.ErrLogTruncated", err)
	}
	var exists bool
	if err := e.pg.QueryRow(t.Context(), `SELECT to_regclass($1) IS NOT NULL`, ShadowTable).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Error("a refused rebuild created its shadow table")
	}
}

// TestHelperRebuildProcess is not a test: it is the child process of TestStateRebuildCrash,
// rebuilding until its crash point kills it.
func TestHelperRebuildProcess(t *testing.T) {
	if os.Getenv("LOCKS_TEST_REBUILD_CHILD") != "1" {
		return
	}
	crashpoint.ArmFromEnv()
	n, _ := strconv.Atoi(os.Getenv("LOCKS_TEST_PARTITIONS"))
	js := testenv.JetStream(t, os.Getenv("LOCKS_TEST_NATS_URL"), "rebuild-child")
	pg, err := pgxpool.New(t.Context(), os.Getenv("LOCKS_TEST_PG_URL"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRebuild(RebuildConfig{PartitionCount: n, BatchSize: 500}, RebuildDeps{JS: js, PG: pg, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(t.Context())
	t.Fatalf("crash point %s never hit (Run returned %+v, %v)", os.Getenv(crashpoint.Env), res, err)
}

// A rebuild killed after a committed shadow batch is continued by the next run, which ends
// equal to the live projection.
func TestStateRebuildCrash(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 4)
	var pub statePublished
	e.publish(t, e.nats.JS, rebuildLog(6, 500, 20000), &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 90*time.Second)
	live := loadStateTable(t, e, "sensor_state")

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRebuildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCKS_TEST_REBUILD_CHILD=1", "LOCKS_TEST_PARTITIONS="+strconv.Itoa(e.n),
		"LOCKS_TEST_NATS_URL="+e.nats.URL, "LOCKS_TEST_PG_URL="+e.pgURL, crashpoint.Env+"="+CrashRebuildAfterBatch+":15")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
		t.Fatalf("child: %v, want exit %d at the crash point\n%s", err, crashpoint.ExitCode, out)
	}
	var done int64
	if err := e.pg.QueryRow(t.Context(), `SELECT count(*) FROM checkpoints WHERE projection = $1`, ShadowName).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if done == 0 {
		t.Fatal("the killed rebuild left no shadow checkpoint")
	}

	rebuildContinues(t, e, len(pub.logs), live, "run after the crash", "across a crash")
	checkStateAgainstModel(t, e, &pub)
}

// The live projector does not trust its cached rows across a swap: a table swapped in under
// the same name (here by hand, with one row's changed_at marked) is read afresh.
func TestStateProjectorRereadsSwappedTable(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 1)
	at := stateT0
	rd := func(id string, d uint8, msg string) event.Log {
		at = at.Add(time.Second)
		return event.Log{V: event.Version, Kind: event.KindReading, SensorID: id, Data: d, Time: at, ReceivedTime: at, MessageID: msg}
	}
	var pub statePublished
	e.publish(t, e.nats.JS, []event.Log{rd("a", 1, "1"), rd("b", 0, "2")}, &pub)
	e.runState(t, e.nats.JS, partition.All(e.n))
	e.waitCaughtUp(t, &pub, 30*time.Second)

	mark := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	err := pgx.BeginFunc(t.Context(), e.pg, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SELECT seq FROM checkpoints WHERE projection = 'state' FOR UPDATE`,
			`CREATE TABLE swapped (LIKE sensor_state INCLUDING ALL)`,
			`INSERT INTO swapped SELECT * FROM sensor_state`,
			`UPDATE swapped SET changed_at = '2001-01-01T00:00:00Z' WHERE sensor_id = 'a'`,
			`ALTER TABLE sensor_state RENAME TO replaced`,
			`ALTER TABLE swapped RENAME TO sensor_state`,
		} {
			if _, err := tx.Exec(t.Context(), q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A repeat of a's value leaves changed_at alone: it must be the mark, not the cached one.
	e.publish(t, e.nats.JS, []event.Log{rd("a", 1, "3")}, &pub)
	e.waitCaughtUp(t, &pub, 30*time.Second)
	if got := loadStateTable(t, e, "sensor_state")["a"]; !got.ChangedAt.Equal(mark) || got.LastSeq != pub.seqs[2] {
		t.Errorf("row of a after the swap: %+v; want changed_at %s kept and the new reading applied", got, mark)
	}
}
