package state

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A batch of an owner whose epoch was superseded by a claim rolls back whole: no row, no
// outbox row, no checkpoint; the new owner's batch then commits.
func TestStateFencedBatchWritesNothing(t *testing.T) {
	t.Parallel()
	e := newStateEnv(t, 1)
	r := rand.New(rand.NewPCG(11, 12))
	var pub statePublished
	e.publish(t, e.nats.JS, stateRandomReadings(r, stateSensorIDs(r, 20), 200, 0.5, stateT0), &pub)
	c, err := e.nats.JS.CreateConsumer(t.Context(), natsx.ReadingsStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := logread.Drain(c.Fetch(200, jetstream.FetchMaxWait(5*time.Second)))
	if err != nil || len(msgs) != 200 {
		t.Fatalf("fetched %d messages: %v", len(msgs), err)
	}
	s, err := New(Config{Partitions: partition.All(1), PartitionCount: 1},
		Deps{JS: e.nats.JS, PG: e.pg, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	old, err := lease.Claim(t.Context(), e.pg, Name, 0, "old")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.applyBatch(t.Context(), 0, old, msgs[:100], nil); err != nil {
		t.Fatal(err)
	}
	before := stateSnapshot(t, e.pg)
	cur, err := lease.Claim(t.Context(), e.pg, Name, 0, "new")
	if err != nil {
		t.Fatal(err)
	}
	err = s.applyBatch(t.Context(), 0, old, msgs[100:], nil)
	var fe *lease.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, lease.ErrFenced) || fe.Epoch != old || fe.Current != cur {
		t.Fatalf("batch of the old owner: %v, want a FencedError of epoch %d, current %d", err, old, cur)
	}
	if after := stateSnapshot(t, e.pg); after != before {
		t.Fatalf("the fenced batch wrote: before %s, after %s", before, after)
	}
	if err := s.applyBatch(t.Context(), 0, cur, msgs[100:], nil); err != nil {
		t.Fatal(err)
	}
	var outbox int
	_ = e.pg.QueryRow(t.Context(), `SELECT count(*) FROM outbox`).Scan(&outbox)
	if m := buildStateModel(&pub, 1); outbox != m.total {
		t.Errorf("outbox has %d rows, want %d", outbox, m.total)
	}
}

// stateSnapshot sums up what the projector writes: checkpoints, rows and outbox.
func stateSnapshot(t testing.TB, pg *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pg.QueryRow(t.Context(), `SELECT
		(SELECT coalesce(string_agg(partition || ':' || seq, ',' ORDER BY partition), '') FROM checkpoints WHERE projection = 'state')
		|| ' rows ' || (SELECT count(*) || '/' || coalesce(sum(revision), 0) FROM sensor_state)
		|| ' outbox ' || (SELECT count(*) FROM outbox)`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// leaseTestTTL is the lease TTL of the lease tests' bucket and processes: shorter than the
// default, so that a killed or paused owner's partitions lapse sooner; still renewed every
// second.
const leaseTestTTL = 3 * time.Second

// newLeaseEnv is a stateEnv of n partitions whose leases live leaseTestTTL.
func newLeaseEnv(t testing.TB, n int) *stateEnv {
	return newStateEnvWith(t, natsx.StreamsConfig{Partitions: n, LeaseTTL: leaseTestTTL})
}

// TestHelperStateLeaseProcess is not a test: it is a state process of the lease tests,
// without fixed partitions, running until it is killed (or for 2 minutes).
func TestHelperStateLeaseProcess(t *testing.T) {
	if os.Getenv("LOCKS_TEST_STATE_LEASE_CHILD") != "1" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv("LOCKS_TEST_PARTITIONS"))
	owner := os.Getenv("LOCKS_TEST_OWNER")
	js := testenv.JetStream(t, os.Getenv("LOCKS_TEST_NATS_URL"), owner)
	pg, err := pgxpool.New(t.Context(), os.Getenv("LOCKS_TEST_PG_URL"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := New(Config{PartitionCount: n, Owner: owner, LeaseTTL: leaseTestTTL, IdleWait: 200 * time.Millisecond, RelayPoll: 100 * time.Millisecond, BatchSize: 50},
		Deps{JS: js, PG: pg, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// leaseChild is a running state process of the lease tests and its output.
type leaseChild struct {
	owner string
	cmd   *exec.Cmd
	mu    sync.Mutex
	out   bytes.Buffer
}

func (c *leaseChild) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *leaseChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func (e *stateEnv) startLeaseChild(t *testing.T, owner string) *leaseChild {
	t.Helper()
	c := &leaseChild{owner: owner}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperStateLeaseProcess$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), "LOCKS_TEST_STATE_LEASE_CHILD=1", "LOCKS_TEST_OWNER="+owner,
		"LOCKS_TEST_NATS_URL="+e.nats.URL, "LOCKS_TEST_PG_URL="+e.pgURL, "LOCKS_TEST_PARTITIONS="+strconv.Itoa(e.n))
	c.cmd.Stdout, c.cmd.Stderr = c, c
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		if t.Failed() {
			t.Logf("output of %s:\n%s", owner, c.output())
		}
	})
	return c
}

// owners returns the owner of each partition in the fence.
func owners(t testing.TB, pg *pgxpool.Pool) map[int]string {
	t.Helper()
	rows, err := pg.Query(t.Context(), `SELECT partition, owner FROM partition_owners WHERE projection = $1`, Name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var p int
		var o string
		if err := rows.Scan(&p, &o); err != nil {
			t.Fatal(err)
		}
		out[p] = o
	}
	return out
}

// ownedBy counts the partitions of each owner.
func ownedBy(o map[int]string) map[string]int {
	c := map[string]int{}
	for _, v := range o {
		c[v]++
	}
	return c
}

// waitOwners waits until the fence shows every partition owned and counts say each owner's
// share.
func (e *stateEnv) waitOwners(t *testing.T, within time.Duration, want map[string]int) {
	t.Helper()
	testenv.Eventually(t, within, "partition owners "+strings.Join(mapStrings(want), " "), func() bool {
		o := owners(t, e.pg)
		got := ownedBy(o)
		if len(o) != e.n || len(got) != len(want) {
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

func mapStrings(m map[string]int) []string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+strconv.Itoa(v))
	}
	return s
}

// Two state processes without fixed partitions share them; one SIGKILLed, the other takes
// its partitions within 10 s, and the state and EVENTS are exactly the model's: no revision
// skipped or repeated.
func TestStateLeaseTakeover(t *testing.T) {
	t.Parallel()
	e := newLeaseEnv(t, 8)
	r := rand.New(rand.NewPCG(13, 14))
	ids := stateSensorIDs(r, 200)
	a, _ := e.startLeaseChild(t, "a"), e.startLeaseChild(t, "b")
	e.waitOwners(t, 30*time.Second, map[string]int{"a": 4, "b": 4})

	var pub statePublished
	logs := stateRandomReadings(r, ids, 4000, 0.5, stateT0)
	e.publish(t, e.nats.JS, logs[:2000], &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)

	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	e.publish(t, e.nats.JS, logs[2000:], &pub)
	e.waitOwners(t, 10*time.Second-time.Since(killed), map[string]int{"b": 8})
	t.Logf("partitions of the killed process taken over %s after the kill", time.Since(killed).Round(time.Millisecond))
	e.waitCaughtUp(t, &pub, 60*time.Second)
	checkStateAgainstModel(t, e, &pub)
}

// A state process paused (SIGSTOP) past its lease loses its partitions to the other; resumed
// (SIGCONT), it commits nothing for them: the other's claim fenced it, and the state and
// EVENTS are exactly the model's.
func TestStateLeasePausedOwnerIsFenced(t *testing.T) {
	t.Parallel()
	e := newLeaseEnv(t, 4)
	r := rand.New(rand.NewPCG(15, 16))
	ids := stateSensorIDs(r, 100)
	a, _ := e.startLeaseChild(t, "a"), e.startLeaseChild(t, "b")
	e.waitOwners(t, 30*time.Second, map[string]int{"a": 2, "b": 2})

	var pub statePublished
	logs := stateRandomReadings(r, ids, 3000, 0.5, stateT0)
	e.publish(t, e.nats.JS, logs[:1000], &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)

	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	e.publish(t, e.nats.JS, logs[1000:2000], &pub)
	e.waitOwners(t, 20*time.Second, map[string]int{"b": 4})
	e.waitCaughtUp(t, &pub, 60*time.Second)
	taken := stateSnapshot(t, e.pg)

	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Resumed, the paused process finds its leases gone before anything else.
	testenv.Eventually(t, 20*time.Second, "the resumed process to notice it lost its partitions", func() bool {
		out := a.output()
		return strings.Contains(out, "lease lapsed") || strings.Contains(out, "lease taken") || strings.Contains(out, "partition fenced")
	})
	if got := stateSnapshot(t, e.pg); got != taken {
		t.Errorf("written while no new reading came: before the resume %s, after %s", taken, got)
	}
	e.publish(t, e.nats.JS, logs[2000:], &pub)
	e.waitCaughtUp(t, &pub, 60*time.Second)
	checkStateAgainstModel(t, e, &pub)
}
