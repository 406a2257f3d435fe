package ops

import (
	"context"
	"sync"
	"time"
)

// ReadyEveryDefault is the longest a round of readiness checks answers /readyz: anyone may
// poll /readyz, and a round dials no new connection but still queries Postgres and
// ClickHouse, so a flood of requests costs at most one round per interval.
const ReadyEveryDefault = time.Second

// SetReadyEvery replaces ReadyEveryDefault; call it before Serve.
func (s *Server) SetReadyEvery(d time.Duration) {
	s.rounds.mu.Lock()
	defer s.rounds.mu.Unlock()
	s.rounds.every = d
}

// roundCache runs at most one round of checks at a time and lets every caller within maxAge
// of the last round share it: /readyz and locks_ready never run the checks per request.
type roundCache struct {
	run func(context.Context) (full, redacted map[string]string)

	mu       sync.Mutex
	every    time.Duration
	at       time.Time
	full     map[string]string
	redacted map[string]string
	inflight chan struct{} // closed when the round in flight ends
}

func (c *roundCache) interval() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.every
}

// get returns the last round if it is younger than maxAge, waits for the round in flight,
// or runs one. The round runs on its own deadline, not the caller's: a client hanging up
// must not fail the round the others wait for. A caller whose ctx ends first gets the
// previous round (or every check "unavailable" before the first).
func (c *roundCache) get(ctx context.Context, maxAge time.Duration) (full, redacted map[string]string) {
	c.mu.Lock()
	for {
		if c.full != nil && time.Since(c.at) < maxAge {
			defer c.mu.Unlock()
			return c.full, c.redacted
		}
		if c.inflight == nil {
			break
		}
		ch := c.inflight
		c.mu.Unlock()
		select {
		case <-ch:
			c.mu.Lock()
			if c.full != nil {
				defer c.mu.Unlock()
				return c.full, c.redacted // the round just ended: fresh whatever maxAge says
			}
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.full != nil {
				return c.full, c.redacted
			}
			return map[string]string{"readiness": "no result yet"}, map[string]string{"readiness": Unavailable}
		}
	}
	ch := make(chan struct{})
	c.inflight = ch
	c.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readinessTimeout)
	full, redacted = c.run(rctx)
	cancel()
	c.mu.Lock()
	c.full, c.redacted, c.at, c.inflight = full, redacted, time.Now(), nil
	c.mu.Unlock()
	close(ch)
	return full, redacted
}
