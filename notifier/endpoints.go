package notifier

import (
	"sync"
	"time"
)

// endpoints isolates receivers from one another: each client's endpoint may have a limited
// number of attempts in flight in this process, and a circuit breaker that opens after
// threshold consecutive failures stops sending to it for a cooldown (doubling up to
// maxCooldown while probes keep failing); after the cooldown one probe attempt is let
// through (half-open), and its success closes the breaker. An endpoint that cannot take an
// attempt now is "busy": the dispatcher does not even claim its deliveries, so they stay in
// Postgres, due, for whichever process can send them, and take no slot from anyone else.
//
// The limit adapts (additive increase, multiplicative decrease): it starts at perEndpoint;
// an endpoint that answers 2xx within fastAttempt while it uses all its slots earns one more,
// up to maxPerEndpoint; a failure halves it (down to 1); a slow success gives one back. So a
// single busy client with a healthy receiver is not held to a handful of attempts at a time
// (one claim round trip per handful: a few hundred deliveries/s), while a hanging or failing
// one soon holds one or two slots at most.
type endpoints struct {
	perEndpoint int
	breakerPolicy

	mu sync.Mutex
	m  map[string]*endpoint
	// changedAt is when each client's registry entry last changed (the API says so over
	// NATS): rows claimed before it are not sent from the queue (queue.go).
	changedAt map[string]time.Time
}

// Defaults of the per-endpoint limit and circuit breaker (Config).
const (
	PerEndpointDefault        = 8
	BreakerThresholdDefault   = 5
	BreakerCooldownDefault    = 30 * time.Second
	BreakerMaxCooldownDefault = 10 * time.Minute
)

// maxPerEndpoint caps the adaptive limit; fastAttempt is what counts as a quick answer.
const (
	maxPerEndpoint = 64
	fastAttempt    = time.Second
)

type endpoint struct {
	limit    int
	inflight int
	queue    []claimed // claimed, waiting for a slot of this endpoint (FIFO)
	slow     bool      // the last answer took queueFastAnswer or more: queue nothing
	breaker
}

// breaker is one endpoint's circuit breaker: its consecutive failures, and once they reach
// the threshold, until when it is open, its current cooldown and whether its half-open
// probe is under way.
type breaker struct {
	fails     int
	openUntil time.Time
	cooldown  time.Duration
	probing   bool
}

// breakerPolicy decides a breaker's transitions; its methods are pure.
type breakerPolicy struct {
	threshold   int
	cooldown    time.Duration
	maxCooldown time.Duration
}

// tripped: b is open or half-open.
func (p breakerPolicy) tripped(b breaker) bool { return b.fails >= p.threshold }

// lets says whether an endpoint with breaker b, inflight attempts under way and limit slots
// may start one more attempt at now: a closed breaker while a slot is free; a tripped one
// only once its cooldown is over, as the single half-open probe.
func (p breakerPolicy) lets(b breaker, inflight, limit int, now time.Time) bool {
	if p.tripped(b) {
		return !now.Before(b.openUntil) && !b.probing && inflight == 0
	}
	return inflight < limit
}

// after is b once an attempt ended at now (ok: a 2xx). A success closes it; the failure that
// reaches the threshold, or of a probe, opens it for a cooldown that doubles from the
// policy's up to maxCooldown while probes keep failing. opened says this outcome opened it.
func (p breakerPolicy) after(b breaker, ok bool, now time.Time) (next breaker, opened bool) {
	wasProbe := b.probing
	b.probing = false
	if ok {
		b.fails, b.cooldown = 0, 0
		return b, false
	}
	b.fails++
	if !wasProbe && b.fails != p.threshold {
		return b, false
	}
	if b.cooldown == 0 {
		b.cooldown = p.cooldown
	} else {
		b.cooldown = min(2*b.cooldown, p.maxCooldown)
	}
	b.openUntil = now.Add(b.cooldown)
	return b, true
}

func newEndpoints(per, threshold int, cooldown, maxCooldown time.Duration) *endpoints {
	return &endpoints{perEndpoint: per, breakerPolicy: breakerPolicy{threshold: threshold, cooldown: cooldown, maxCooldown: maxCooldown},
		m: map[string]*endpoint{}, changedAt: map[string]time.Time{}}
}

// canTake is whether e may take one more attempt now; e's lock is held.
func (es *endpoints) canTake(e *endpoint, now time.Time) bool {
	return es.lets(e.breaker, e.inflight, e.limit, now)
}

// capacity is what every endpoint this process knows can take now.
func (es *endpoints) capacity(now time.Time) capacity {
	es.mu.Lock()
	defer es.mu.Unlock()
	c := capacity{perClient: es.perEndpoint}
	for id, e := range es.m {
		free := 0
		switch {
		case es.tripped(e.breaker): // open, or half-open: one probe
			if es.canTake(e, now) {
				free = 1
			}
		default:
			free = e.depth() - e.inflight - len(e.queue)
		}
		if free <= 0 {
			c.busy = append(c.busy, id)
			continue
		}
		c.freeClient, c.free = append(c.freeClient, id), append(c.free, int32(free))
	}
	return c
}

// acquire takes a slot of client's endpoint, or reports false.
func (es *endpoints) acquire(client string, now time.Time) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	if e == nil {
		e = &endpoint{limit: es.perEndpoint}
		es.m[client] = e
	}
	if !es.canTake(e, now) {
		return false
	}
	if es.tripped(e.breaker) {
		e.probing = true
	}
	e.inflight++
	return true
}

// release returns a slot with the attempt's result and how long it took; it reports whether
// the breaker opened.
func (es *endpoints) release(client string, ok bool, took time.Duration, now time.Time) (opened bool) {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	if e == nil {
		return false
	}
	saturated := e.inflight <= e.limit && 2*e.inflight >= e.limit
	e.inflight--
	switch {
	case !ok:
		e.limit = max(1, e.limit/2)
	case took >= fastAttempt:
		e.limit = max(es.perEndpoint, e.limit-1)
	case saturated:
		e.limit = min(maxPerEndpoint, e.limit+1)
	}
	e.slow = took >= queueFastAnswer
	e.breaker, opened = es.after(e.breaker, ok, now)
	if e.inflight == 0 && e.fails == 0 && e.limit == es.perEndpoint && len(e.queue) == 0 {
		delete(es.m, client)
	}
	return opened
}

// reset closes client's breaker and forgets its failures (an operator fixed the endpoint):
// its deliveries are claimable at once. Attempts in flight keep their slots.
func (es *endpoints) reset(client string) {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	if e == nil {
		return
	}
	e.breaker = breaker{}
	e.limit = max(e.limit, es.perEndpoint)
	if e.inflight == 0 && len(e.queue) == 0 {
		delete(es.m, client)
	}
}

// open reports whether client's breaker is open or half-open in this process.
func (es *endpoints) open(client string) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	e := es.m[client]
	return e != nil && es.tripped(e.breaker)
}
