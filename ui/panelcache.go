package ui

import (
	"context"
	"sync"
	"time"
)

// panelCache shares each panel's data among every open tab: at most one read of a panel at a
// time, and its result answers every request within maxAge of it.
type panelCache struct {
	mu      sync.Mutex
	entries map[string]*panelEntry
	gen     uint64 // bumped by reset: a read started before it is not kept
}

type panelEntry struct {
	at       time.Time
	data     map[string]any
	err      error
	inflight chan struct{} // closed when the read in flight ends
}

func newPanelCache() *panelCache { return &panelCache{entries: map[string]*panelEntry{}} }

// get is key's data if read within maxAge, the result of the read in flight, or a new read.
// The read runs on its own deadline, not the caller's: a tab closing must not fail the read
// the others wait for.
func (c *panelCache) get(ctx context.Context, key string, maxAge time.Duration,
	load func(context.Context) (map[string]any, error)) (map[string]any, error) {
	c.mu.Lock()
	e := c.entries[key]
	if e == nil {
		e = &panelEntry{}
		c.entries[key] = e
	}
	for {
		if e.inflight == nil && !e.at.IsZero() && time.Since(e.at) < maxAge {
			defer c.mu.Unlock()
			return e.data, e.err
		}
		if e.inflight == nil {
			break
		}
		ch := e.inflight
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
		if !e.at.IsZero() && e.inflight == nil {
			defer c.mu.Unlock()
			return e.data, e.err // the read just ended: fresh whatever maxAge says
		}
	}
	ch := make(chan struct{})
	e.inflight = ch
	gen := c.gen
	c.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), panelTimeout)
	data, err := load(rctx)
	cancel()
	c.mu.Lock()
	e.inflight = nil
	if gen == c.gen {
		e.data, e.err, e.at = data, err, time.Now()
	}
	c.mu.Unlock()
	close(ch)
	return data, err
}

// reset forgets every panel's data: an operator's action (resend, re-enable, rebuild) shows
// at the next refresh.
func (c *panelCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, e := range c.entries {
		e.at = time.Time{}
	}
}
