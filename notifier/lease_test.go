package notifier

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// ownersOf counts the EVENTS partitions each notifier owns in the fence, and how many have one.
func (e *env) ownersOf() (map[string]int, int) {
	e.t.Helper()
	rows, err := e.pool.Query(e.t.Context(), `SELECT owner FROM partition_owners WHERE projection = $1`, Name)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	got, n := map[string]int{}, 0
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			e.t.Fatal(err)
		}
		got[o]++
		n++
	}
	return got, n
}

func (e *env) waitOwners(within time.Duration, want map[string]int) {
	e.t.Helper()
	testenv.Eventually(e.t, within, fmt.Sprint("notifier partition owners ", want), func() bool {
		got, n := e.ownersOf()
		if n != testPartitions || len(got) != len(want) {
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

// Two notifiers without fixed partitions share the EVENTS partitions; one SIGKILLed while
// events flow, the other takes its partitions within 10 s, and a real receiver gets every
// event (each sensor has one, so none is superseded).
func TestNotifierLeaseTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.client("c1", rc.URL)
	const sensors = 400
	e.exec(`INSERT INTO sensors (id, address) SELECT 's' || i, 'here' FROM generate_series(1, $1) i`, sensors)
	e.exec(`INSERT INTO subscriptions (client_id, sensor_id) SELECT 'c1', 's' || i FROM generate_series(1, $1) i`, sensors)
	owner := func(name string) string { return ownerEnv + "=" + name }
	// A delivery the killed process had claimed is sent again once its row lease runs out: the
	// 1 s timeout plus a margin shorter than the default, so the test waits seconds, not half a minute.
	margin := "LOCKS_WEBHOOK_LEASE_MARGIN=7s"
	a, _ := e.child("100ms,100ms,100ms", "", owner("a"), margin), e.child("100ms,100ms,100ms", "", owner("b"), margin)
	e.waitOwners(30*time.Second, map[string]int{"a": 2, "b": 2})

	var killed time.Time
	for chunk := range 20 {
		var evs []event.Event
		for i := chunk*sensors/20 + 1; i <= (chunk+1)*sensors/20; i++ {
			evs = append(evs, testEvent(fmt.Sprintf("s%d", i), 1, 1))
		}
		e.publish(evs...)
		if chunk == 7 {
			a.Kill()
			killed = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.waitOwners(10*time.Second-time.Since(killed), map[string]int{"b": testPartitions})
	t.Logf("partitions of the killed notifier taken over %s after the kill", time.Since(killed).Round(time.Millisecond))

	missing := func() []string {
		got := map[string]bool{}
		for _, h := range rc.got() {
			if h.status == 200 {
				got[h.header.Get("webhook-id")] = true
			}
		}
		var out []string
		for i := 1; i <= sensors; i++ {
			if id := event.ID(fmt.Sprintf("s%d", i), 1); !got[id] {
				out = append(out, id)
			}
		}
		return out
	}
	testenv.Eventually(t, 60*time.Second, "every event delivered", func() bool { return len(missing()) == 0 })
	if m := missing(); len(m) > 0 {
		t.Fatalf("%d events never delivered: %s", len(m), strings.Join(m[:min(len(m), 10)], " "))
	}
}

// An ingest batch of an owner whose epoch was superseded by a claim writes no delivery row
// and acks nothing; the new owner's batch then writes them.
func TestNotifierFencedIngestWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.client("c1", "http://127.0.0.1:1/")
	e.sensor("s1", "here")
	e.subscribe("c1", "s1")
	e.publish(testEvent("s1", 1, 1))
	cfg := e.cfg
	cfg.Partitions = partition.All(testPartitions)
	n, err := New(cfg, Deps{JS: e.nats.JS, PG: e.pool, Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	p := partition.Of("s1", testPartitions)
	old, err := lease.Claim(t.Context(), e.pool, Name, p, "old")
	if err != nil {
		t.Fatal(err)
	}
	stale := &intake{p: p, epoch: old}
	r, err := logread.Open(t.Context(), e.nats.JS, n.eventsSpec(stale))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := r.Fetch(t.Context(), 10, 10*time.Second)
	if err != nil || len(batch) != 1 {
		t.Fatalf("fetch EVENTS: %d messages, %v; want 1", len(batch), err)
	}
	cur, err := lease.Claim(t.Context(), e.pool, Name, p, "new")
	if err != nil {
		t.Fatal(err)
	}
	err = n.ingestBatch(t.Context(), stale, batch)
	var fe *lease.FencedError
	if !errors.As(err, &fe) || fe.Epoch != old || fe.Current != cur {
		t.Fatalf("ingest of the old owner: %v, want a FencedError of epoch %d, current %d", err, old, cur)
	}
	if pos, _, err := readPosition(t.Context(), e.pool, p); err != nil || pos.seq != 0 {
		t.Fatalf("position after the fenced ingest: %+v %v, want 0 (the stream's start)", pos, err)
	}
	rows := func() int {
		var c int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM notifier_deliveries`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := rows(); c != 0 {
		t.Fatalf("the fenced ingest wrote %d delivery rows", c)
	}
	if err := n.ingestBatch(t.Context(), &intake{p: p, epoch: cur, stream: stale.stream}, batch); err != nil {
		t.Fatal(err)
	}
	if c := rows(); c != 1 {
		t.Fatalf("%d delivery rows after the owner's ingest, want 1", c)
	}
	if pos, _, err := readPosition(t.Context(), e.pool, p); err != nil || pos != (position{seq: 1, stream: stale.stream}) {
		t.Fatalf("position after the owner's ingest: %+v %v, want 1 of stream %s", pos, err, stale.stream)
	}
}

// The EVENTS consumer of a partition deleted under a running notifier (a process that
// claimed the partition meanwhile, or an operator) is created again from its position:
// the partition's later events are still delivered, not left waiting for a restart.
func TestNotifierConsumerDeletedUnderIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rc := newReceiver(t, func(int, http.ResponseWriter, *http.Request) int { return http.StatusNoContent })
	e.subscribed(rc.URL)
	e.start()
	e.publish(testEvent("s1", 1, 1))
	testenv.Eventually(t, 15*time.Second, "the first event delivered", func() bool { return rc.count() >= 1 })

	name := "notifier-" + strconv.Itoa(partition.Of("s1", testPartitions))
	if err := e.nats.JS.DeleteConsumer(t.Context(), natsx.EventsStream, name); err != nil {
		t.Fatal(err)
	}
	e.publish(testEvent("s1", 2, 0))
	testenv.Eventually(t, 30*time.Second, "the event after the deletion delivered", func() bool { return rc.count() >= 2 })
	if _, err := e.nats.JS.Consumer(t.Context(), natsx.EventsStream, name); err != nil {
		t.Errorf("consumer %s after the recovery: %v", name, err)
	}
}
