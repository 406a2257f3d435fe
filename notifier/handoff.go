package notifier

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Leasing at intake: the intake's transaction leases the deliveries it creates that may be
// attempted at once and hands them to the dispatcher after its commit, so that a delivery
// of a healthy receiver's key does not wait for a claim of its own (a transaction, and the
// dispatcher's turn). The lease is claim's (queueLease: the same re-check of eligibility,
// and the registry read), taken in the transaction that makes the rows: no other process
// sees them before they are leased, and a row whose key has an older pending or in-flight
// row is left to claim, in revision order. A crash between the commit and the attempt
// leaves the rows leased, as a crash after a claim does: they are attempted when the lease
// ends.

// intakeLease is what an intake transaction leases: the pending rows it created, within
// what each client's endpoint can take now (as claim's window counts it) and the free
// attempt slots.
type intakeLease struct {
	ids      []int64
	sensors  []string
	token    int64
	leasedAt time.Time
}

// leasable picks from ins the rows to lease at intake, given the endpoints' capacity and
// the free attempt slots. at is a time before the transaction began, whose now() the lease
// counts from, as claim's leasedAt: the attempt's room within the lease (work's fresh) is
// then never overstated.
func leasable(ins inserted, c capacity, free int, at time.Time) intakeLease {
	l := intakeLease{token: rand.Int64(), leasedAt: at}
	taken := map[string]int{}
	room := c.rooms()
	for i, id := range ins.ids {
		if len(l.ids) >= free {
			break
		}
		client := ins.clients[i]
		if taken[client] >= room(client) {
			continue
		}
		taken[client]++
		l.ids, l.sensors = append(l.ids, id), append(l.sensors, ins.sensors[i])
	}
	return l
}

// queue queues the lease (queueLease) on b, in the intake's transaction after
// insertDeliveries, whose settings (pgtx.GenericPlans: sequential scans off, as queueLease
// needs) hold until the commit.
func (l intakeLease) queue(b *pgx.Batch, lease time.Duration) {
	if len(l.ids) > 0 {
		queueLease(b, l.ids, l.sensors, lease, l.token)
	}
}

// read reads what queue queued, if anything: the rows leased.
func (l intakeLease) read(br pgx.BatchResults) ([]claimed, error) {
	if len(l.ids) == 0 {
		return nil, nil
	}
	return readLease(br, l.token, l.leasedAt)
}

// freeSlots is how many rows the intake may lease for the dispatcher: the free attempt
// slots while it runs, none otherwise.
func (n *Notifier) freeSlots() int {
	if !n.dispatching.Load() {
		return 0
	}
	return n.slots()
}

// handOff gives the rows leased at intake to the dispatcher; when it is stopping, their
// leases are released instead.
func (n *Notifier) handOff(ctx context.Context, cs []claimed) {
	if len(cs) == 0 {
		return
	}
	select {
	case n.handoff <- cs:
		n.m.intakeLeased.Add(float64(len(cs)))
	case <-ctx.Done():
		n.giveBack(ctx, cs)
	}
}

// startHanded starts the attempts of rows leased at intake within the free slots, and
// gives back the rest; it reports whether it gave any back (they are for a claim now).
func (n *Notifier) startHanded(ctx context.Context, wg *sync.WaitGroup, cs []claimed) bool {
	free := max(0, n.slots())
	gave := len(cs) > free
	if gave {
		n.giveBack(ctx, cs[free:])
		cs = cs[:free]
	}
	return n.start(ctx, wg, cs, n.clock.Now()) < len(cs) || gave
}

// giveBack releases the leases of rows not attempted, also while stopping.
func (n *Notifier) giveBack(ctx context.Context, cs []claimed) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := unlease(uctx, n.db, cs); err != nil {
		n.log.Warn("release unsent claims (their leases will expire)", "err", err)
	}
}
