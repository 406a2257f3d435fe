package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/nats-io/nats.go/jetstream"
)

// eventChecker holds the events of one partition read from EVENTS and not matched yet.
type eventChecker struct {
	// pg is the pool, and the swap's transaction while the swap applies the tail: the
	// lookups must not wait for a pool connection that live batches blocked by the swap hold.
	pg        rowQuerier
	p         int
	cons      *logread.Reader
	seen      map[string][]byte // event id → payload
	truncated bool              // EVENTS no longer holds its start
	// renumbered: READINGS no longer holds its start, so the rebuild numbers a sensor's
	// revisions from its first kept reading and its events cannot be compared with those
	// published; each is counted unverified, and the swap continues the live revisions.
	renumbered bool

	checked, unverified int
}

// drain reads EVENTS on until it has read the event id (or the end): the relay publishes a
// partition's events in the order they were derived, so only a short window is held.
func (c *eventChecker) drain(ctx context.Context, id string) error {
	for {
		if _, ok := c.seen[id]; ok {
			return nil
		}
		msgs, err := c.cons.Fetch(ctx, 1000, 0)
		if err != nil {
			return fmt.Errorf("read EVENTS partition %d: %w", c.p, err)
		}
		for _, m := range msgs {
			mid := m.Headers().Get(jetstream.MsgIDHeader)
			if mid == "" {
				ev, err := event.DecodeEvent(m.Data())
				if err != nil {
					continue
				}
				mid = ev.ID
			}
			c.seen[mid] = m.Data()
		}
		if len(msgs) == 0 {
			return ctx.Err()
		}
	}
}

// check matches e against what was published (or is about to be, in the live outbox) under
// its id. An event found nowhere is fine only when the live projection has not reached its
// revision, which the swap's tail would otherwise contradict.
func (c *eventChecker) check(ctx context.Context, e event.Event) error {
	if c.renumbered {
		c.unverified++
		return nil
	}
	want, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	match := func(have []byte, where string) error {
		c.checked++
		if sameEvent(have, want) {
			return nil
		}
		return fmt.Errorf("%w: %s in %s is %s, the rebuild derives %s", ErrEventMismatch, e.ID, where, have, want)
	}
	lookup := func() ([]byte, bool) {
		b, ok := c.seen[e.ID]
		if ok {
			delete(c.seen, e.ID)
		}
		return b, ok
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	if err := c.drain(ctx, e.ID); err != nil {
		return err
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	var payload []byte
	err = c.pg.QueryRow(ctx, `SELECT payload FROM outbox WHERE event_id = $1`, e.ID).Scan(&payload)
	if err == nil {
		return match(payload, "the outbox")
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up event %s in the outbox: %w", e.ID, err)
	}
	// The relay may have published and deleted it meanwhile: it publishes first.
	if err := c.drain(ctx, e.ID); err != nil {
		return err
	}
	if b, ok := lookup(); ok {
		return match(b, "EVENTS")
	}
	var rev int64
	err = c.pg.QueryRow(ctx, `SELECT revision FROM sensor_state WHERE sensor_id = $1`, e.SensorID).Scan(&rev)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("live revision of %s: %w", e.SensorID, err)
	}
	switch {
	case rev < e.Revision:
		return nil // newer than the live projection: it derives and publishes it itself
	case c.truncated:
		c.unverified++
		return nil
	}
	return fmt.Errorf("%w: %s (sensor %s revision %d) is in neither EVENTS nor the outbox, but the live projection is at revision %d",
		ErrEventMismatch, e.ID, e.SensorID, e.Revision, rev)
}

// sameEvent compares an event as stored with one as encoded here, through one decoding so
// that only content counts.
func sameEvent(stored, want []byte) bool {
	if bytes.Equal(stored, want) {
		return true
	}
	ev, err := event.DecodeEvent(stored)
	if err != nil {
		return false
	}
	b, err := json.Marshal(ev)
	return err == nil && bytes.Equal(b, want)
}
