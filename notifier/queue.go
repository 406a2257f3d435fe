package notifier

import "time"

// queueFactor is how many rounds of its limit a healthy endpoint may have claimed ahead.
const queueFactor = 8

// Queued rows are attempted with what the claim read of the registry (URL, secrets,
// subscription): an endpoint queues only while it answers within queueFastAnswer, so its
// queue (queueFactor rounds of its limit) drains within about a second, and a row queued
// longer than queueMaxWait is given back, to be claimed again and read afresh.
const (
	queueFastAnswer = 100 * time.Millisecond
	queueMaxWait    = 2 * time.Second
)

// leaseMargin is kept between the end of a queued row's attempt and its lease's expiry: a
// row must not be attempted by two processes (another may claim it once the lease expires).
const leaseMargin = 5 * time.Second

// LeaseMarginDefault is Config.LeaseMargin: how long a delivery's lease outlasts its
// attempt's timeout, for the outcome to be recorded before another process may send it.
const LeaseMarginDefault = 30 * time.Second

// depth is how many rows e may hold, attempted or queued: a failing or slow endpoint queues
// none (its queued rows would wait so long that their leases ran out).
func (e *endpoint) depth() int {
	if e.fails > 0 || e.slow {
		return e.limit
	}
	return e.limit * queueFactor
}

// enqueue keeps c for client's next free slot, or reports false when the endpoint cannot
// queue it (failing, slow, full, or without an attempt in flight to take it up later).
func (es *endpoints) enqueue(client string, c claimed) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	if e == nil || e.inflight == 0 || e.fails > 0 || e.slow || e.inflight+len(e.queue) >= e.depth() ||
		es.staleClaim(client, c) {
		return false
	}
	e.queue = append(e.queue, c)
	return true
}

// next is called when an attempt of client has ended (its slot released): it takes the
// next queued row that may still be attempted and a slot for it (ok), and returns the rows
// to give back: all of them when stopping or when the breaker is open, and those whose
// lease leaves no room for an attempt (fresh reports false). more says the endpoint has
// room for a claim again (half its depth).
func (es *endpoints) next(client string, stopping bool, fresh func(claimed) bool) (c claimed, ok bool, back []claimed, more bool) {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	if e == nil {
		return claimed{}, false, nil, true
	}
	if stopping || e.fails >= es.threshold {
		back, e.queue = e.queue, nil
		return claimed{}, false, back, true
	}
	for len(e.queue) > 0 && e.inflight < e.limit {
		c, e.queue = e.queue[0], e.queue[1:]
		if !fresh(c) || es.staleClaim(client, c) {
			back = append(back, c)
			continue
		}
		e.inflight++
		ok = true
		break
	}
	if len(e.queue) == 0 {
		e.queue = nil // let the backing array go
	}
	return c, ok, back, 2*(e.inflight+len(e.queue)) <= e.depth()
}

// changed records that client's registry entry changed at: its rows claimed before are not
// sent from the queue but given back and claimed again. Entries older than queueMaxWait
// cannot concern a queued row any more and are dropped.
func (es *endpoints) changed(client string, at time.Time) {
	es.mu.Lock()
	defer es.mu.Unlock()
	for k, t := range es.changedAt {
		if at.Sub(t) > queueMaxWait {
			delete(es.changedAt, k)
		}
	}
	es.changedAt[client] = at
}

// staleClaim is whether c was claimed before client's registry entry last changed; es's lock
// is held.
func (es *endpoints) staleClaim(client string, c claimed) bool {
	t, ok := es.changedAt[client]
	return ok && !c.leasedAt.After(t)
}
