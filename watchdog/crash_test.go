package watchdog

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
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
	w, err := New(Config{PartitionCount: testPartitions, LostAfter: lostAfter},
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

// TestCrashAfterFact kills the watchdog right after it appended a fact and before it marked
// the key declared; the restarted watchdog settles the same expiry again: still one fact.
func TestCrashAfterFact(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lostAfter)
	pgURL := e.pg.Config().ConnString()
	f := e.collectFacts()
	child := func(crash string) *testenv.Child {
		return testenv.StartChild(t, os.Stderr, childEnv+"=1",
			"LOCKS_TEST_CHILD_NATS="+e.nats.URL, "LOCKS_TEST_CHILD_PG="+pgURL,
			"LOCKS_TEST_CHILD_AMQP="+e.rabbit.URL, "LOCKS_TEST_CHILD_QUEUE="+e.rabbit.Queue,
			crashpoint.Env+"="+crash)
	}
	first := child("watchdog.after_fact")
	e.reading("crashy")
	select {
	case <-first.Done():
		if first.ExitCode() != crashpoint.ExitCode {
			t.Fatalf("child exited with %d, want the crash point's %d", first.ExitCode(), crashpoint.ExitCode)
		}
	case <-time.After(20 * time.Second):
		first.Kill()
		t.Fatal("the child did not reach the crash point")
	}
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
