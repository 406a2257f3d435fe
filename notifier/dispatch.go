package notifier

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
)

// Defaults of the dispatcher.
const (
	// MaxInFlightDefault is Config.MaxInFlight: concurrent attempts per process.
	MaxInFlightDefault = 512
	// PollIntervalDefault is Config.PollInterval.
	PollIntervalDefault = time.Second
)

// dispatch claims due deliveries and starts their attempts, within the global and
// per-endpoint limits, until ctx is done and every attempt it started has ended.
func (n *Notifier) dispatch(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	n.dispatching.Store(true)
	defer n.dispatching.Store(false)
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	busyLoop := false
	for ctx.Err() == nil {
		free := n.slots()
		if free <= 0 {
			select {
			case <-n.slotFreed:
			case cs := <-n.handoff:
				n.startHanded(ctx, &wg, cs)
			case <-ctx.Done():
			}
			continue
		}
		if free < n.cfg.MaxInFlight/4 && busyLoop {
			free = n.gatherSlots(ctx, free)
		}
		now := n.clock.Now()
		limit := min(free, n.cfg.Batch)
		capa := n.ep.capacity(now)
		cs, err := claim(ctx, n.db, capa, limit, rand.Int64(), n.lease)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.log.Error("claim deliveries", "err", err)
			retry.Wait(ctx)
			continue
		}
		if ctx.Err() != nil {
			n.giveBack(ctx, cs) // claimed as the dispatcher was stopping
			return
		}
		retry.Reset()
		started := n.start(ctx, &wg, cs, now)
		busyLoop = started > 0
		if started > 0 && len(cs) == limit {
			continue // more may be due
		}
		// A claim that found fewer rows than it could take took every row due at its
		// snapshot: what was committed since has poked wake, so it is not claimed again at
		// once for nothing, nor when a slot frees unless the endpoints' room held rows back.
		n.idle(ctx, &wg, nextDue(ctx, n.db, n.cfg.PollInterval), capa.heldBack(cs))
	}
}

// idle waits up to wait for a reason to claim (a wake-up, a free slot when slots held
// rows back, the wait's end), starting meanwhile the attempts of rows leased at intake.
func (n *Notifier) idle(ctx context.Context, wg *sync.WaitGroup, wait time.Duration, slotsMatter bool) {
	t := time.NewTimer(max(wait, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case cs := <-n.handoff:
			if n.startHanded(ctx, wg, cs) {
				return // some were given back: claim them
			}
			continue
		case <-n.wake:
		case <-n.slotFreed:
			if !slotsMatter {
				continue
			}
		case <-t.C:
		case <-ctx.Done():
		}
		return
	}
}

// slots is how many attempts this process may start now (MaxInFlight less those in flight).
func (n *Notifier) slots() int { return n.cfg.MaxInFlight - int(n.inflight.Load()) }

// gatherSlots waits briefly for a quarter of the slots to be free: claiming for one or two
// free slots at a time would cost a claim per delivery. It returns the free slots.
func (n *Notifier) gatherSlots(ctx context.Context, free int) int {
	t := time.NewTimer(2 * time.Millisecond)
	defer t.Stop()
	for free < n.cfg.MaxInFlight/4 {
		select {
		case <-n.slotFreed:
			free = n.slots()
			continue
		case <-t.C:
		case <-ctx.Done():
		}
		break
	}
	return free
}

// work makes c's attempt, then those of the rows queued for its endpoint while a slot is
// free (queue.go), keeping its global slot, and hands back the queued rows it may not send.
func (n *Notifier) work(ctx context.Context, c claimed) {
	fresh := func(q claimed) bool {
		return time.Since(q.leasedAt) < min(queueMaxWait, n.lease-n.cfg.WebhookTimeout-leaseMargin)
	}
	for {
		r := n.attempt(ctx, c)
		if !r.aborted && n.ep.release(c.clientID, r.state == StateDelivered, r.latency, n.clock.Now()) {
			n.m.breaker.Inc()
			n.log.Warn("circuit opened for a failing webhook endpoint", "client", c.clientID, "status", r.status, "err", r.errText)
		} else if r.aborted {
			n.ep.release(c.clientID, true, 0, n.clock.Now())
		}
		n.results <- r
		next, ok, back, more := n.ep.next(c.clientID, ctx.Err() != nil, fresh)
		for _, b := range back {
			n.results <- result{c: b, aborted: true, at: time.Now()} // the lease is released, nothing recorded
		}
		if !ok {
			n.inflight.Add(-1)
			poke(n.slotFreed)
			return
		}
		if more {
			poke(n.slotFreed)
		}
		c = next
	}
}

// start begins the attempts of the claimed rows its endpoints can take, cancels those of
// deleted or unsubscribed clients, and gives back the rest; it returns how many it handled.
func (n *Notifier) start(ctx context.Context, wg *sync.WaitGroup, cs []claimed, now time.Time) int {
	var excess []claimed
	started := 0
	for _, c := range cs {
		if c.url == "" || !c.subscribed {
			why := "client deleted"
			if c.url != "" {
				why = "client unsubscribed from the sensor"
			}
			n.results <- result{c: c, state: StateCancelled, errText: why, at: now}
			started++
			continue
		}
		if !n.ep.acquire(c.clientID, now) {
			if n.ep.enqueue(c.clientID, c) {
				started++
			} else {
				excess = append(excess, c)
			}
			continue
		}
		started++
		n.inflight.Add(1)
		wg.Go(func() { n.work(ctx, c) })
	}
	if len(excess) > 0 {
		n.giveBack(ctx, excess)
	}
	return started
}
