package watchdog

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// childEnv switches the test binary into running a watchdog (see TestMain).
const childEnv = "LOCKS_WATCHDOG_TEST_CHILD"

// The tests run side by side: they mostly wait for TTLs and lost_after to pass.
func TestMain(m *testing.M) {
	testenv.Parallel(12)
	testenv.ChildMain(m, childEnv, runChild)
}

// runChild runs a watchdog from LOCKS_TEST_* variables until SIGTERM (or a crash point).
func runChild() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	nc, err := natsx.Connect(os.Getenv("LOCKS_TEST_CHILD_NATS"), "watchdog-child", log)
	if err != nil {
		log.Error("child", "err", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 1
	}
	pg, err := pgxpool.New(ctx, os.Getenv("LOCKS_TEST_CHILD_PG"))
	if err != nil {
		return 1
	}
	defer pg.Close()
	la := lostAfter
	if v := os.Getenv("LOCKS_TEST_CHILD_LOST_AFTER"); v != "" {
		if la, err = time.ParseDuration(v); err != nil {
			return 1
		}
	}
	var leaseTTL time.Duration
	if v := os.Getenv("LOCKS_TEST_CHILD_LEASE_TTL"); v != "" {
		if leaseTTL, err = time.ParseDuration(v); err != nil {
			return 1
		}
	}
	w, err := New(Config{PartitionCount: testPartitions, LostAfter: la, LeaseTTL: leaseTTL},
		Deps{JS: js, PG: pg, Logger: log, Registerer: prometheus.NewRegistry(),
			Lag: RabbitLag(os.Getenv("LOCKS_TEST_CHILD_AMQP"), os.Getenv("LOCKS_TEST_CHILD_QUEUE"), 0, 50*time.Millisecond)})
	if err != nil {
		log.Error("child", "err", err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		log.Error("child", "err", err)
		return 1
	}
	return 0
}

// child starts a watchdog in a child process (runChild) with lost_after la, to die at the
// crash point crash ("": none).
func (e *env) child(crash string, la time.Duration) *testenv.Child {
	e.t.Helper()
	return testenv.StartChild(e.t, os.Stderr, childEnv+"=1",
		"LOCKS_TEST_CHILD_NATS="+e.nats.URL, "LOCKS_TEST_CHILD_PG="+e.pgURL,
		"LOCKS_TEST_CHILD_AMQP="+e.rabbit.URL, "LOCKS_TEST_CHILD_QUEUE="+e.rabbit.Queue,
		"LOCKS_TEST_CHILD_LOST_AFTER="+la.String(), "LOCKS_TEST_CHILD_LEASE_TTL="+e.leaseTTL.String(),
		crashpoint.Env+"="+crash)
}

// crashLeaseTTL is the lease TTL of the crash tests: the restarted watchdog takes the
// partitions the crashed one held once its leases lapse, which the default TTL would make
// the longest wait of the test. Renewed every second, a lease still outlives a loaded
// machine's stalls.
const crashLeaseTTL = 3 * time.Second

// waitCrashed waits for c to die at its crash point.
func waitCrashed(t *testing.T, c *testenv.Child) {
	t.Helper()
	select {
	case <-c.Done():
		if c.ExitCode() != crashpoint.ExitCode {
			t.Fatalf("child exited with %d, want the crash point's %d", c.ExitCode(), crashpoint.ExitCode)
		}
	case <-time.After(20 * time.Second):
		c.Kill()
		t.Fatal("the child did not reach the crash point")
	}
}

// TestCrashAfterFact kills the watchdog right after it appended a fact and before it marked
// the key declared; the restarted watchdog settles the same expiry again: still one fact.
func TestCrashAfterFact(t *testing.T) {
	t.Parallel()
	e := newEnvLeases(t, lostAfter, crashLeaseTTL)
	f := e.collectFacts()
	child := func(crash string) *testenv.Child { return e.child(crash, lostAfter) }
	first := child("watchdog.after_fact")
	e.reading("crashy")
	waitCrashed(t, first)
	// Acknowledged before the crash; the collector's subscription may still be behind.
	testenv.Eventually(t, 10*time.Second, "the fact appended before the crash", func() bool { return len(f.of("crashy")) >= 1 })
	if n := len(f.of("crashy")); n != 1 {
		t.Fatalf("%d facts after the crash, want the 1 appended before it", n)
	}
	kvs, err := e.nats.JS.Stream(t.Context(), kvStream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := kvs.GetLastMsgForSubject(t.Context(), natsx.LivenessKeySubject(keyOf("crashy", testPartitions))); err != nil || m.Header.Get(jetstream.MarkerReasonHeader) != "MaxAge" {
		t.Fatalf("key after the crash: %v %v, want the unsettled marker", m, err)
	}
	kv, err := e.nats.JS.KeyValue(t.Context(), natsx.LivenessBucket)
	if err != nil {
		t.Fatal(err)
	}
	child("") // stopped at the end of the test
	// The restarted watchdog settles the marker: the key says declared, and no second fact.
	deadline := time.Now().Add(15 * time.Second)
	for {
		entry, err := kv.Get(t.Context(), keyOf("crashy", testPartitions))
		if err == nil {
			var v keyValue
			if json.Unmarshal(entry.Value(), &v) != nil || !v.Lost {
				t.Fatalf("key after restart %s, want declared", entry.Value())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted watchdog did not settle the marker: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(f.of("crashy")); n != 1 {
		t.Fatalf("%d facts after restart, want 1", n)
	}
}

// TestCrashBeforePositionWritten kills the watchdog (with the NATS server, whose memory
// consumers go with it, as an embedded one's do) right after refreshes that no position
// covers yet; the restarted watchdog resumes right after the last position written, and
// every sensor's key ends at its last reading, with no fact.
func TestCrashBeforePositionWritten(t *testing.T) {
	t.Parallel()
	const la = 30 * time.Second // every reading writes its key, none expires during the test
	e := newEnvLeases(t, la, crashLeaseTTL)
	f := e.collectFacts()
	child := func(crash string) *testenv.Child { return e.child(crash, la) }
	var sensors []string
	for i := range 40 {
		sensors = append(sensors, "crash"+strconv.Itoa(i))
	}
	last := map[string]uint64{}
	e.appendAll(sensors, last)
	first := child(CrashAfterRefresh + ":" + strconv.Itoa(len(sensors)+len(sensors)/2))
	// The first round is applied and in the positions.
	testenv.Eventually(t, 20*time.Second, "the first round in the positions", func() bool {
		for _, s := range sensors {
			if e.storedPosition(partition.Of(s, testPartitions)).Seq < last[s] {
				return false
			}
		}
		return true
	})
	// The second round: the watchdog dies halfway through it.
	e.appendAll(sensors, last)
	waitCrashed(t, first)
	var positions [testPartitions]position
	for p := range testPartitions {
		positions[p] = e.storedPosition(p)
	}
	uncovered := 0
	for _, s := range sensors {
		if last[s] > positions[partition.Of(s, testPartitions)].Seq {
			uncovered++
		}
	}
	if uncovered < len(sensors)/2 {
		t.Fatalf("%d readings after the positions %+v at the crash, want at least the %d the watchdog died before", uncovered, positions, len(sensors)/2)
	}
	e.nats.Restart(0)
	child("")
	e.waitKeysAt(last, 20*time.Second)
	for p := range testPartitions {
		if got, want := e.consumerStart(p).OptStartSeq, max(positions[p].Seq+1, 1); got != want {
			t.Errorf("partition %d resumed at %d, want %d (after its position %+v)", p, got, want, positions[p])
		}
	}
	f.mu.Lock()
	n := len(f.all)
	f.mu.Unlock()
	if n != 0 {
		t.Errorf("%d facts, want none: every sensor reported within lost_after", n)
	}
}
