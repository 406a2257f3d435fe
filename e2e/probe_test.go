package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lock-sensors/lock-sensors/internal/staterev"
)

// changeProbe measures publish → state from outside the system by the revision, which
// grows by exactly 1 with each event of a sensor and is written whenever the state changes
// (so it does not depend on how often liveness is written): a few probe sensors of their own
// get a reading every `every`, each one a change (the data alternates), on the same queue as
// the load, and sensor_state is polled every 20 ms for their revisions. A reading is in the
// state when its sensor's revision reaches the reading's; the error is at most the poll
// interval.
type changeProbe struct {
	pool   *pgxpool.Pool
	ch     *amqp.Channel
	queue  string
	ids    []string
	every  time.Duration
	seed   string
	sentMu sync.Mutex
	sent   map[string][]probeSent // per sensor, oldest first, not yet seen
	rev    map[string]int64       // per sensor, revision of its last reading sent (Run's own)
	lat    []time.Duration
	n      int64 // readings published
	err    error
}

type probeSent struct {
	rev int64
	at  time.Time
}

// newChangeProbe publishes on its own confirmed channel of conn. The sensors ids must not
// have had readings before (their first reading is revision 1).
func newChangeProbe(conn *amqp.Connection, pool *pgxpool.Pool, queue string, ids []string, every time.Duration) (*changeProbe, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	return &changeProbe{pool: pool, ch: ch, queue: queue, ids: ids, every: every, seed: fmt.Sprint(time.Now().UnixNano()),
		sent: map[string][]probeSent{}, rev: map[string]int64{}}, nil
}

// Run publishes a reading every interval until stop is closed (a reading on its way is
// confirmed first, so that Published counts every reading sent); Poll must be running. It
// may be run again after it returned.
func (p *changeProbe) Run(stop <-chan struct{}) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		i := p.n // only Run writes n and rev
		id := p.ids[i%int64(len(p.ids))]
		rev := p.rev[id] + 1
		now := time.Now().UTC()
		body := fmt.Appendf(nil, `{"sensor_id":%q,"data":%d,"ts":%q}`, id, rev%2, now.Format(time.RFC3339Nano))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Timestamp: now,
			// Unique over every run: an id seen before is the same reading (the contract).
			MessageId: fmt.Sprintf("probe-%s-%d", p.seed, i), Body: body,
		})
		if err == nil {
			var ok bool
			ok, err = dc.WaitContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("probe reading nacked")
			}
		}
		cancel()
		p.sentMu.Lock()
		if err != nil {
			p.err = err
			p.sentMu.Unlock()
			return
		}
		p.rev[id] = rev
		p.sent[id] = append(p.sent[id], probeSent{rev, now})
		p.n++
		p.sentMu.Unlock()
	}
}

// Poll reads the probe sensors' revisions every 20 ms until ctx is done.
func (p *changeProbe) Poll(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// An index probe per sensor (staterev), not sensor_id = ANY($1): that plan scans
		// every partition of sensor_state whole at each poll, Postgres work of the probe's own
		// that grows with the fleet and takes CPU from the system it measures.
		revs, err := staterev.Of(ctx, p.pool, p.ids)
		if err != nil {
			continue // a busy moment; the next poll sees the same revisions
		}
		now := time.Now()
		p.sentMu.Lock()
		for id, rev := range revs {
			q := p.sent[id]
			k := 0
			for k < len(q) && q[k].rev <= rev {
				p.lat = append(p.lat, now.Sub(q[k].at))
				k++
			}
			p.sent[id] = q[k:]
		}
		p.sentMu.Unlock()
	}
}

// Published is the probe readings published so far; Pending those not yet in the state.
func (p *changeProbe) Published() (published int64, pending int) {
	p.sentMu.Lock()
	defer p.sentMu.Unlock()
	for _, q := range p.sent {
		pending += len(q)
	}
	return p.n, pending
}

// Latencies returns the publish → state latencies after the first `from`, and how many in all.
func (p *changeProbe) Latencies(from int) ([]time.Duration, int) {
	p.sentMu.Lock()
	defer p.sentMu.Unlock()
	from = min(from, len(p.lat))
	return slices.Clone(p.lat[from:]), len(p.lat)
}

// Err is why publishing stopped, if it failed.
func (p *changeProbe) Err() error {
	p.sentMu.Lock()
	defer p.sentMu.Unlock()
	return p.err
}
