package watchdog

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const lostAfter = 3 * time.Second

// checkOnTime asserts that sensor got exactly one fact, between lo and hi after last.
func checkOnTime(t *testing.T, f *facts, sensor string, last time.Time, lo, hi time.Duration, want time.Duration) {
	t.Helper()
	got, ok := f.waitFact(sensor, last.Add(hi+time.Second))
	if !ok {
		t.Fatalf("%s: no liveness_timeout within %s of its last reading", sensor, hi+time.Second)
	}
	for what, d := range map[string]time.Duration{"fact received_time": got.fact.ReceivedTime.Sub(last), "fact in READINGS": got.seen.Sub(last)} {
		if d < lo || d > hi {
			t.Errorf("%s: %s %s after the last reading, want within [%s, %s]", sensor, what, d, lo, hi)
		} else {
			t.Logf("%s: %s %s after the last reading", sensor, what, d.Round(time.Millisecond))
		}
	}
	if got.fact.LostAfter != want || got.fact.V != event.Version {
		t.Errorf("%s: fact %+v, want v%d lost_after %s", sensor, got.fact, event.Version, want)
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lostAfter)
	ctx := t.Context()
	// Per-sensor override, as the admin API writes it.
	if _, err := e.pg.Exec(ctx, `INSERT INTO sensors (id, address, lost_after_ms) VALUES ('slow', 'x', 5000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pg.Exec(ctx, `INSERT INTO sensors (id, address, lost_after_ms) VALUES ('slowchatty', 'x', 5000)`); err != nil {
		t.Fatal(err)
	}
	f := e.collectFacts()
	// It loads the overrides before it consumes anything.
	e.start(Config{LostAfter: lostAfter})

	cases := []struct {
		name      string
		sensor    string
		every     time.Duration // 0: one reading, then silence
		count     int
		wantLost  bool
		lostAfter time.Duration
	}{
		{name: "silent sensor", sensor: "silent1", wantLost: true, lostAfter: lostAfter},
		{name: "another silent sensor", sensor: "SILENT2", wantLost: true, lostAfter: lostAfter},
		{name: "sensor reporting every second", sensor: "chatty", every: time.Second, count: 9},
		{name: "override lost_after 5s", sensor: "slow", wantLost: true, lostAfter: 5 * time.Second},
		{name: "override: reporting every 4s", sensor: "slowchatty", every: 4 * time.Second, count: 3, lostAfter: 5 * time.Second},
	}
	var wg sync.WaitGroup
	lasts := make([]time.Time, len(cases))
	for i, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lasts[i] = e.reading(c.sensor)
			for n := 1; n < c.count; n++ {
				time.Sleep(c.every)
				lasts[i] = e.reading(c.sensor)
			}
		}()
	}
	wg.Wait()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.wantLost {
				checkOnTime(t, f, c.sensor, lasts[i], c.lostAfter, c.lostAfter+1500*time.Millisecond, c.lostAfter)
				return
			}
			// While it kept reporting there was no fact.
			for _, s := range f.of(c.sensor) {
				if s.fact.ReceivedTime.Before(lasts[i]) {
					t.Errorf("%s got a liveness_timeout at %s while reporting (last reading %s)", c.sensor, s.fact.ReceivedTime, lasts[i])
				}
			}
		})
	}
	// A repeated expiry check of an already declared sensor appends nothing.
	t.Run("declared sensor is not declared again", func(t *testing.T) {
		time.Sleep(2 * time.Second)
		if n := len(f.of("silent1")); n != 1 {
			t.Errorf("silent1 has %d facts, want 1", n)
		}
	})
}

// TestSettleIsIdempotent runs the same expiry through settle twice, as a crash between the
// append and the key update would on restart: one fact.
func TestSettleIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	w, s := e.handDriven(lostAfter)
	ctx := t.Context()
	// Owned as a running watchdog would own it: settle acts only for its own partitions.
	w.parts[partition.Of("dup", testPartitions)] = &partState{lease: ctx}
	e.reading("dup")
	if err := w.settle(ctx, s, "dup", candidate{}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.of("dup")); n != 0 {
		t.Fatalf("%d facts before lost_after, want 0", n)
	}
	w.clock = testenv.ClockAhead(lostAfter) // lost_after has passed, for settle
	// Concurrent and repeated settling of the same expiry, as a restart would redo it.
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.settle(ctx, s, "dup", candidate{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := w.settle(ctx, s, "dup", candidate{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(f.of("dup")) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(f.of("dup")); n != 1 {
		t.Fatalf("%d facts for one expiry, want 1", n)
	}
}

func TestRestartsDuringCountdown(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		restart func(e *env, stopWatchdog func()) func()
	}{
		{name: "watchdog restarted", restart: func(e *env, stop func()) func() {
			stop()
			time.Sleep(time.Second)
			_, _, stop2 := e.start(Config{LostAfter: lostAfter})
			return stop2
		}},
		{name: "NATS restarted", restart: func(e *env, stop func()) func() {
			e.nats.Restart(500 * time.Millisecond)
			return stop
		}},
		{name: "watchdog down across the deadline", restart: func(e *env, stop func()) func() {
			stop()
			time.Sleep(2500 * time.Millisecond) // the key expires while nobody watches
			_, _, stop2 := e.start(Config{LostAfter: lostAfter})
			return stop2
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, lostAfter)
			f := e.collectFacts()
			_, _, stop := e.start(Config{LostAfter: lostAfter})
			e.reading("warm") // the watchdog is running and caught up
			last := e.reading("victim")
			time.Sleep(800 * time.Millisecond)
			stop = c.restart(e, stop)
			defer stop()
			checkOnTime(t, f, "victim", last, lostAfter, lostAfter+1500*time.Millisecond, lostAfter)
			// Once: nothing more comes.
			time.Sleep(2 * time.Second)
			if n := len(f.of("victim")); n != 1 {
				t.Errorf("victim has %d facts, want 1", n)
			}
		})
	}
}

// TestHeldWhileBridgeBehind stops the bridge for 3 × lost_after while one sensor keeps
// publishing to RabbitMQ and another has really stopped: the keys of both expire, both are
// held; after the bridge drains the backlog only the stopped one is declared.
func TestHeldWhileBridgeBehind(t *testing.T) {
	t.Parallel()
	// The test waits in multiples of lost_after: the shortest that leaves "keeps" four
	// readings per lost_after.
	const lostAfter, every = 2 * time.Second, 500 * time.Millisecond
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	_, reg, _ := e.start(Config{LostAfter: lostAfter})
	e.publishRabbit("keeps", 0)
	e.publishRabbit("stopped", 0)
	// Both readings are through the bridge and refreshed.
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, reg, "locks_watchdog_refreshes_total") < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two readings did not reach the watchdog")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stoppedLast := time.Now()
	e.stopBridge()
	// "keeps" publishes for the whole test: through the outage and after it.
	publishing := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for n := 1; ; n++ {
			select {
			case <-publishing:
				return
			case <-time.After(every):
				e.publishRabbit("keeps", n)
			}
		}
	}()
	defer func() { close(publishing); <-stopped }()
	time.Sleep(3 * lostAfter)
	if got := counter(t, reg, "locks_watchdog_expiries_total"); got < 2 {
		t.Errorf("%v expiries seen during the outage, want both keys expired (>= 2)", got)
	}
	f.mu.Lock()
	during := len(f.all)
	f.mu.Unlock()
	if during != 0 {
		t.Fatalf("%d facts appended while the bridge was behind", during)
	}
	restarted := time.Now()
	e.startBridge()
	got, ok := f.waitFact("stopped", restarted.Add(5*time.Second))
	if !ok {
		t.Fatal("the sensor that really stopped was not declared after catch-up")
	}
	if got.fact.ReceivedTime.Before(restarted) || got.fact.ReceivedTime.Sub(stoppedLast) < lostAfter {
		t.Errorf("fact at %s: before the bridge restart %s, or less than lost_after after the last reading %s", got.fact.ReceivedTime, restarted, stoppedLast)
	}
	// The one that kept publishing: no fact, also for a while after catch-up.
	time.Sleep(lostAfter)
	if n := len(f.of("keeps")); n != 0 {
		t.Errorf("the sensor that kept publishing got %d liveness_timeout facts", n)
	}
	if n := len(f.of("stopped")); n != 1 {
		t.Errorf("the stopped sensor got %d facts, want 1", n)
	}
	// Its key is alive again, refreshed by the drained backlog.
	kv, err := e.nats.JS.KeyValue(t.Context(), natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(t.Context(), keyOf("keeps", testPartitions)); err != nil {
		t.Errorf("key of the publishing sensor after catch-up: %v, want a live value", err)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, time.Minute)
	ctx := t.Context()
	w, reg, _ := e.start(Config{LostAfter: time.Minute})
	insert := func(sensor string, lastSeen time.Time, seq uint64) {
		t.Helper()
		if _, err := e.pg.Exec(ctx, `INSERT INTO sensor_state (sensor_id, partition, data, last_seen, last_reading_time, changed_at, revision, last_seq)
			VALUES ($1, 0, 1, $2, $2, $2, 1, $3)`, sensor, lastSeen, int64(seq)); err != nil {
			t.Fatal(err)
		}
	}
	// Consistent: a reading the watchdog applied, and the projection with it.
	e.reading("ok")
	deadline := time.Now().Add(10 * time.Second)
	for counter(t, reg, "locks_watchdog_refreshes_total") < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	kv, err := e.nats.JS.KeyValue(ctx, natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, keyOf("ok", testPartitions))
	if err != nil {
		t.Fatal(err)
	}
	var v keyValue
	if err := json.Unmarshal(entry.Value(), &v); err != nil {
		t.Fatal(err)
	}
	insert("ok", time.Unix(0, v.ReceivedNS), v.Seq)
	n, err := w.Sweep(ctx)
	if err != nil || n != 0 {
		t.Fatalf("sweep of a consistent state: %d repairs, %v; want 0", n, err)
	}
	// A sensor the projection saw 10 s ago whose key is missing: recreated with ~50 s left.
	seen := time.Now().Add(-10 * time.Second)
	insert("nokey", seen, 12345)
	n, err = w.Sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep with a missing key: %d repairs, %v; want 1", n, err)
	}
	entry, err = kv.Get(ctx, keyOf("nokey", testPartitions))
	if err != nil {
		t.Fatalf("key not recreated: %v", err)
	}
	if err := json.Unmarshal(entry.Value(), &v); err != nil || v.Seq != 12345 || v.ReceivedNS != seen.Truncate(time.Microsecond).UnixNano() {
		t.Errorf("recreated key %s, want seq 12345 received %d", entry.Value(), seen.UnixNano())
	}
	if got := counter(t, reg, "locks_watchdog_reconcile_repairs_total"); got != 1 {
		t.Errorf("repairs metric %v, want 1", got)
	}
	// Each sweep's result per partition is kept for the alerter (reconciliation_drift).
	recorded := func() int {
		t.Helper()
		var r int
		if err := e.pg.QueryRow(ctx, `SELECT repairs FROM watchdog_sweeps WHERE partition = 0`).Scan(&r); err != nil {
			t.Fatalf("watchdog_sweeps of partition 0: %v", err)
		}
		return r
	}
	if r := recorded(); r != 1 {
		t.Errorf("recorded repairs of partition 0 after the repairing sweep: %d, want 1", r)
	}
	if n, err := w.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("second sweep: %d repairs, %v; want 0", n, err)
	}
	if r := recorded(); r != 0 {
		t.Errorf("recorded repairs of partition 0 after a clean sweep: %d, want 0", r)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		deps Deps
	}{
		{"no deps", Config{PartitionCount: 1, LostAfter: time.Second}, Deps{}},
		{"lost_after under a second", Config{PartitionCount: 1, LostAfter: 500 * time.Millisecond}, Deps{}},
		{"owned partition out of range", Config{PartitionCount: 2, Partitions: []int{2}, LostAfter: time.Second}, Deps{}},
		{"no partitions", Config{LostAfter: time.Second}, Deps{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(c.cfg, c.deps); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	// A missing dependency fails as in every part, naming each one.
	_, err := New(Config{PartitionCount: 1, LostAfter: time.Second}, Deps{})
	if !errors.Is(err, part.ErrMissingDep) || !strings.Contains(err.Error(), "watchdog: missing dependency: Logger, Registerer, JS, PG, Lag") {
		t.Errorf("New without deps: %v, want part.ErrMissingDep naming Logger, Registerer, JS, PG, Lag", err)
	}
}

// TestPartitionsSplitBetweenProcesses runs two watchdogs owning half the partitions each:
// every silent sensor gets exactly one fact, from the process that owns its partition.
func TestPartitionsSplitBetweenProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	_, regA, _ := e.start(Config{Partitions: []int{0, 1}, LostAfter: lostAfter})
	_, regB, _ := e.start(Config{Partitions: []int{2, 3}, LostAfter: lostAfter})
	sensors := []string{"a1", "b2", "c3", "d4", "e5", "f6", "g7", "h8"}
	lasts := map[string]time.Time{}
	for _, s := range sensors {
		lasts[s] = e.reading(s)
	}
	for _, s := range sensors {
		checkOnTime(t, f, s, lasts[s], lostAfter, lostAfter+1500*time.Millisecond, lostAfter)
	}
	time.Sleep(time.Second)
	for _, s := range sensors {
		if n := len(f.of(s)); n != 1 {
			t.Errorf("%s: %d facts, want 1", s, n)
		}
	}
	a, b := counter(t, regA, "locks_watchdog_facts_total"), counter(t, regB, "locks_watchdog_facts_total")
	if a+b != float64(len(sensors)) || a == 0 || b == 0 {
		t.Errorf("facts by process: %v and %v, want %d split between both", a, b, len(sensors))
	}
}

// TestNoStormAfterNATSOutage keeps a few sensors publishing to RabbitMQ four times per
// lost_after while NATS is down for 2 × lost_after (the bridge cannot append; what it holds is
// unacked, so the queue shows no ready backlog): when NATS returns, every key has expired, yet
// no sensor that kept publishing gets a fact; the one that had really stopped gets one.
func TestNoStormAfterNATSOutage(t *testing.T) {
	t.Parallel()
	// The test waits in multiples of lost_after: the shortest with four readings per lost_after.
	const lostAfter, every = 2 * time.Second, 500 * time.Millisecond
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	_, reg, _ := e.start(Config{LostAfter: lostAfter})
	publishing := []string{"p1", "p2", "p3", "p4", "p5"}
	for _, s := range append([]string{"gone"}, publishing...) {
		e.publishRabbit(s, 0)
	}
	stopPublishing := make(chan struct{})
	publisherDone := make(chan struct{})
	go func() {
		defer close(publisherDone)
		for n := 1; ; n++ {
			select {
			case <-stopPublishing:
				return
			case <-time.After(every):
				for _, s := range publishing {
					e.publishRabbit(s, n)
				}
			}
		}
	}()
	defer func() { close(stopPublishing); <-publisherDone }()
	// Every sensor's key written before the outage.
	testenv.Eventually(t, 10*time.Second, "the first readings to reach the watchdog", func() bool {
		return counter(t, reg, "locks_watchdog_refreshes_total") >= 6
	})
	e.nats.Restart(2 * lostAfter)
	back := time.Now()
	got, ok := f.waitFact("gone", back.Add(10*time.Second))
	if !ok {
		t.Fatal("the sensor that had stopped was not declared after the outage")
	}
	t.Logf("gone declared %s after NATS came back", got.fact.ReceivedTime.Sub(back).Round(time.Millisecond))
	time.Sleep(lostAfter)
	for _, s := range publishing {
		if n := len(f.of(s)); n != 0 {
			t.Errorf("%s kept publishing through the outage and got %d liveness_timeout facts", s, n)
		}
	}
}
