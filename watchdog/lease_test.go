package watchdog

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// TestHelperWatchdogLeaseProcess is not a test: it is a watchdog process of the lease tests,
// without fixed partitions, running until it is killed (or for 2 minutes).
func TestHelperWatchdogLeaseProcess(t *testing.T) {
	if os.Getenv("LOCKS_TEST_WATCHDOG_LEASE_CHILD") != "1" {
		return
	}
	owner := os.Getenv("LOCKS_TEST_OWNER")
	lostAfter, _ := time.ParseDuration(os.Getenv("LOCKS_TEST_LOST_AFTER"))
	js := testenv.JetStream(t, os.Getenv("LOCKS_TEST_NATS_URL"), owner)
	pg, err := pgxpool.New(t.Context(), os.Getenv("LOCKS_TEST_PG_URL"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// No upstream to wait for: the test appends straight to READINGS.
	noLag := func(context.Context) (bool, error) { return false, nil }
	w, err := New(Config{PartitionCount: testPartitions, Owner: owner, LostAfter: lostAfter},
		Deps{JS: js, PG: pg, Logger: log, Registerer: prometheus.NewRegistry(), Lag: noLag})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// leaseChild is a running watchdog process of the lease tests and its output.
type leaseChild struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *leaseChild) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (e *env) startLeaseChild(t *testing.T, owner string, lostAfter time.Duration) *leaseChild {
	t.Helper()
	c := &leaseChild{}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperWatchdogLeaseProcess$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), "LOCKS_TEST_WATCHDOG_LEASE_CHILD=1", "LOCKS_TEST_OWNER="+owner,
		"LOCKS_TEST_NATS_URL="+e.nats.URL, "LOCKS_TEST_PG_URL="+e.pgURL, "LOCKS_TEST_LOST_AFTER="+lostAfter.String())
	c.cmd.Stdout, c.cmd.Stderr = c, c
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() {
			c.mu.Lock()
			t.Logf("output of %s:\n%s", owner, c.out.String())
			c.mu.Unlock()
		}
	})
	return c
}

// watchdogOwners is the owner of each partition in the fence.
func (e *env) watchdogOwners() map[int]string {
	e.t.Helper()
	rows, err := e.pg.Query(e.t.Context(), `SELECT partition, owner FROM partition_owners WHERE projection = $1`, Name)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var p int
		var o string
		if err := rows.Scan(&p, &o); err != nil {
			e.t.Fatal(err)
		}
		out[p] = o
	}
	return out
}

func (e *env) waitWatchdogOwners(within time.Duration, want map[string]int) {
	e.t.Helper()
	testenv.Eventually(e.t, within, fmt.Sprint("watchdog partition owners ", want), func() bool {
		o := e.watchdogOwners()
		got := map[string]int{}
		for _, v := range o {
			got[v]++
		}
		if len(o) != testPartitions || len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// Two watchdogs without fixed partitions share them; one SIGKILLed, the other takes its
// partitions within 10 s. Sensors that keep reporting are never declared lost, though
// their keys expire while nobody owns their partition; sensors that go silent at the kill
// (one in each partition) are declared lost exactly once.
func TestWatchdogLeaseTakeover(t *testing.T) {
	t.Parallel()
	const lostAfter = 3 * time.Second
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	a, _ := e.startLeaseChild(t, "a", lostAfter), e.startLeaseChild(t, "b", lostAfter)
	e.waitWatchdogOwners(30*time.Second, map[string]int{"a": 2, "b": 2})

	var live, silent []string
	for i := 0; len(silent) < testPartitions || len(live) < 20; i++ {
		s := "s" + strconv.Itoa(i)
		if p := partition.Of(s, testPartitions); len(silent) == p {
			silent = append(silent, s)
		} else if len(live) < 20 {
			live = append(live, s)
		}
	}
	// A round's readings are appended at once, not one after the other: on a loaded machine
	// twenty appends in a row can take longer than lost_after.
	report := func(sensors []string) {
		var wg sync.WaitGroup
		for _, s := range sensors {
			wg.Go(func() {
				if _, err := e.append(t.Context(), s, ""); err != nil {
					t.Errorf("append a reading of %s: %v", s, err)
				}
			})
		}
		wg.Wait()
	}
	for range 5 {
		report(live)
		report(silent)
		time.Sleep(300 * time.Millisecond)
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The live sensors report every 300 ms throughout, in their own goroutine.
	stop := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			report(live)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	e.waitWatchdogOwners(10*time.Second-time.Since(killed), map[string]int{"b": testPartitions})
	t.Logf("partitions of the killed watchdog taken over %s after the kill", time.Since(killed).Round(time.Millisecond))
	// Every silent sensor's expiry settled, by the new owner for the killed one's partitions;
	// then one more lost_after and the catch-up grace of a held expiry, long enough for a
	// second fact of a silent sensor, or a fact of a live one judged at the takeover, to show.
	for _, s := range silent {
		f.waitFact(s, killed.Add(4*lostAfter+5*time.Second)) // counted below
	}
	time.Sleep(lostAfter + CatchUpGraceDefault)
	close(stop)
	<-reported
	for _, s := range live {
		if got := f.of(s); len(got) > 0 {
			t.Errorf("sensor %s kept reporting and was declared lost: %+v", s, got[0].fact)
		}
	}
	for _, s := range silent {
		if got := f.of(s); len(got) != 1 {
			// The stream sequences tell two stored facts from one the collector saw twice.
			var seqs []uint64
			for _, g := range got {
				seqs = append(seqs, g.seq)
			}
			t.Errorf("silent sensor %s (partition %d): %d liveness_timeout facts (READINGS sequences %v), want 1",
				s, partition.Of(s, testPartitions), len(got), seqs)
		}
	}
}

// A watchdog settles nothing for a partition it no longer holds: not owned, or owned by a
// Work whose context ended (lease lapsed or lost); owned, the same expiry gets its fact.
func TestSettleOnlyWhileOwned(t *testing.T) {
	t.Parallel()
	const lostAfter = time.Second
	e := newEnv(t, lostAfter)
	f := e.collectFacts()
	w, s := e.handDriven(lostAfter)
	e.reading("gone")
	w.clock = testenv.ClockAhead(lostAfter) // lost_after has passed, for settle
	p := partition.Of("gone", testPartitions)
	lapsed, cancel := context.WithCancel(t.Context())
	cancel()
	for name, ps := range map[string]*partState{"not owned": nil, "lease lapsed": {lease: lapsed}} {
		w.parts[p] = ps
		if ps == nil {
			delete(w.parts, p)
		}
		if err := w.settle(t.Context(), s, "gone", candidate{}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(f.of("gone")); n != 0 {
		t.Fatalf("%d facts appended for a partition not held, want 0", n)
	}
	w.parts[p] = &partState{lease: t.Context()}
	if err := w.settle(t.Context(), s, "gone", candidate{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.waitFact("gone", time.Now().Add(5*time.Second)); !ok {
		t.Fatal("no fact once the partition is held")
	}
}
