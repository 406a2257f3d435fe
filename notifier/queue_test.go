package notifier

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// gatedReceiver holds every request until open is closed, then answers with status.
type gatedReceiver struct {
	books    *booksReceiver
	open     chan struct{}
	status   atomic.Int32
	inflight atomic.Int32
	received atomic.Int32
}

func newGatedReceiver() *gatedReceiver {
	g := &gatedReceiver{books: newBooksReceiver(), open: make(chan struct{})}
	g.status.Store(http.StatusNoContent)
	return g
}

func (g *gatedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.received.Add(1)
	g.inflight.Add(1)
	defer g.inflight.Add(-1)
	select {
	case <-g.open:
	case <-r.Context().Done():
		return
	}
	if s := int(g.status.Load()); s != http.StatusNoContent {
		w.WriteHeader(s)
		return
	}
	g.books.ServeHTTP(w, r)
}

// queueEnv is one client with limit 2 behind a gated receiver, 20 sensors subscribed, the
// notifier started and each sensor's revision 1 published (a newer revision would supersede
// the rows given back).
func queueEnv(t *testing.T, setup func(*env)) (*env, *Notifier, *gatedReceiver, []event.Event) {
	e := newEnv(t, time.Minute)
	g := newGatedReceiver()
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
	})
	e.client("c1", srv.URL)
	var evs []event.Event
	for s := range 20 {
		evs = append(evs, testEvent(fmt.Sprintf("q%d", s), 1, 1))
	}
	for s := range 20 {
		e.sensor(fmt.Sprintf("q%d", s), "address")
		e.subscribe("c1", fmt.Sprintf("q%d", s))
	}
	e.cfg.PerEndpoint = 2
	e.cfg.WebhookTimeout = 30 * time.Second
	if setup != nil {
		setup(e)
	}
	n := e.start()
	e.publish(evs...)
	return e, n, g, evs
}

// waitClaimedAhead waits until the endpoint has depth-2 rows queued behind its 2 attempts
// in flight, and checks that they are leased in the table.
func waitClaimedAhead(t *testing.T, e *env, n *Notifier, depth int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "rows queued behind the 2 attempts in flight", func() bool {
		n.ep.mu.Lock()
		defer n.ep.mu.Unlock()
		ep := n.ep.m["c1"]
		return ep != nil && ep.inflight == 2 && len(ep.queue) == depth-2
	})
	// Rows leased at intake over the endpoint's depth (two partitions' intakes, each
	// within the capacity it saw) are given back when handed to the dispatcher.
	leased := func() int { return e.count(`SELECT count(*) FROM notifier_deliveries WHERE lease_until > now()`) }
	testenv.Eventually(t, 5*time.Second, fmt.Sprintf("the %d rows attempted or queued, and only they, leased", depth),
		func() bool { return leased() == depth })
}

func (e *env) count(sql string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// A healthy endpoint whose slots are all taken gets rows claimed ahead, queueFactor rounds
// of its limit, which wait leased and unattempted for a slot; then everything is delivered
// once and in order per sensor.
func TestHealthyEndpointClaimsAhead(t *testing.T) {
	t.Parallel()
	e, n, g, evs := queueEnv(t, nil)
	const depth = 2 * queueFactor
	waitClaimedAhead(t, e, n, depth)
	if n := g.inflight.Load(); n != 2 {
		t.Fatalf("%d attempts in flight, want the endpoint's limit 2", n)
	}
	if n := e.count(`SELECT count(*) FROM notifier_deliveries WHERE lease_until > now() AND attempts = 0`); n != depth {
		t.Fatalf("%d leased rows without an attempt recorded, want %d", n, depth)
	}
	close(g.open)
	// Revision 2 once revision 1 is in: a row given back while a newer revision exists
	// would be superseded instead of sent.
	testenv.Eventually(t, 30*time.Second, "revision 1 delivered", func() bool { return g.books.count() >= len(evs) })
	for s := range 20 {
		evs = append(evs, testEvent(fmt.Sprintf("q%d", s), 2, 0))
	}
	e.publish(evs[20:]...)
	testenv.Eventually(t, 30*time.Second, "every webhook", func() bool { return g.books.count() >= len(evs) })
	testenv.Eventually(t, 10*time.Second, "every row delivered", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'delivered'`) == len(evs)
	})
	g.books.check(t, evs)
}

// When the endpoint fails until its breaker opens, the rows queued for it are given back
// unattempted (pending, lease released) instead of being sent to it: every attempt counted
// in the table is one the receiver got.
func TestQueuedRowsGivenBackWhenBreakerOpens(t *testing.T) {
	t.Parallel()
	e, n, g, _ := queueEnv(t, func(e *env) {
		e.cfg.BreakerThreshold = 2
		e.cfg.BreakerCooldown = time.Hour
	})
	const depth = 2 * queueFactor
	waitClaimedAhead(t, e, n, depth)
	g.status.Store(http.StatusInternalServerError)
	close(g.open)
	testenv.Eventually(t, 20*time.Second, "leases released", func() bool {
		return e.count(`SELECT count(*) FROM notifier_deliveries WHERE lease_until IS NOT NULL`) == 0
	})
	got := int(g.received.Load())
	if got >= depth {
		t.Fatalf("the receiver got %d attempts after its breaker opened at 2 failures, want fewer than the %d rows claimed", got, depth)
	}
	if n := e.count(`SELECT coalesce(sum(attempts), 0) FROM notifier_deliveries`); n != got {
		t.Fatalf("%d attempts recorded, the receiver got %d", n, got)
	}
	if n := e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'pending' AND attempts = 0`); n != 20-got {
		t.Fatalf("%d rows pending and unattempted, want %d", n, 20-got)
	}
}

// next skips a queued row whose lease leaves no room for an attempt, giving it back, and
// starts the next one in a free slot.
func TestEndpointQueueStaleLease(t *testing.T) {
	t.Parallel()
	es := newEndpoints(1, 5, time.Second, time.Second)
	now := time.Unix(1000, 0)
	if !es.acquire("a", now) {
		t.Fatal("first slot refused")
	}
	for i := range 3 {
		if !es.enqueue("a", claimed{id: int64(i)}) {
			t.Fatalf("row %d not queued", i)
		}
	}
	es.release("a", true, fastAttempt, now) // a slow answer: the limit stays 1
	c, ok, back, _ := es.next("a", false, func(c claimed) bool { return c.id != 0 })
	if !ok || c.id != 1 || len(back) != 1 || back[0].id != 0 {
		t.Fatalf("next = %d %v, back %v; want row 1 started and the stale row 0 given back", c.id, ok, back)
	}
	if _, ok, _, _ := es.next("a", false, func(claimed) bool { return true }); ok {
		t.Fatal("a second row started beside the first in a limit of 1")
	}
}

// An endpoint whose last answer was slow queues nothing: its rows would wait past their
// leases. A fast answer lets it queue again.
func TestEndpointQueueNotWhenSlow(t *testing.T) {
	t.Parallel()
	es := newEndpoints(2, 5, time.Second, time.Second)
	now := time.Unix(1000, 0)
	es.acquire("a", now)
	es.acquire("a", now)
	es.release("a", true, queueFastAnswer, now)
	for es.acquire("a", now) {
	}
	if es.enqueue("a", claimed{id: 1}) {
		t.Fatal("a row queued behind a slow endpoint")
	}
	if c := es.capacity(now); len(c.busy) != 1 {
		t.Fatalf("capacity = %+v, want a busy (its slots taken, no queue)", c)
	}
	es.release("a", true, time.Millisecond, now)
	for es.acquire("a", now) {
	}
	if !es.enqueue("a", claimed{id: 2}) {
		t.Fatal("a fast endpoint refused a queued row")
	}
}

// A client's registry entry changed (here its URL) while rows were claimed ahead for it: the
// API says so over NATS, and the queued rows are claimed again and read afresh instead of
// being sent to the old URL; only the attempts in flight at the change go there.
func TestQueuedRowsReadAfreshAfterChange(t *testing.T) {
	t.Parallel()
	e, n, g, evs := queueEnv(t, nil)
	const depth = 2 * queueFactor
	waitClaimedAhead(t, e, n, depth)
	moved := newBooksReceiver()
	srv := httptest.NewServer(moved)
	t.Cleanup(srv.Close)
	if _, err := e.pool.Exec(t.Context(), `UPDATE clients SET webhook_url = $1, version = version + 1 WHERE id = 'c1'`, srv.URL); err != nil {
		t.Fatal(err)
	}
	if err := NewControls(ControlsDeps{PG: e.pool, NC: e.nats.JS.Conn()}).Changed("c1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the change to reach the notifier", func() bool {
		n.ep.mu.Lock()
		defer n.ep.mu.Unlock()
		_, ok := n.ep.changedAt["c1"]
		return ok
	})
	close(g.open)
	testenv.Eventually(t, 30*time.Second, "every webhook", func() bool { return g.books.count()+moved.count() >= len(evs) })
	if got := int(g.received.Load()); got != 2 {
		t.Errorf("the old URL got %d requests, want only the 2 in flight at the change", got)
	}
	if got := moved.count(); got != len(evs)-2 {
		t.Errorf("the new URL got %d webhooks, want %d", got, len(evs)-2)
	}
}
