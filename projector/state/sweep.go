package state

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// sweep is a rebuild's first pass: it applies to every worker's partition its READINGS
// messages up to the live projection's checkpoint, reading the stream once, in order,
// through one unfiltered consumer, and handing each partition's messages to its worker in
// batches. A consumer filtered to one partition costs the NATS server, for each message it
// delivers from a block far from the block's end, a walk over every subject of the partition
// in the block; an unfiltered one reads the blocks straight through. The workers follow the
// rest (what the live projector applied meanwhile) with their own consumers, near the end of
// the stream, where a filtered consumer is cheap.
func (r *Rebuild) sweep(ctx context.Context, workers []*shadowWorker, pending *atomic.Uint64) error {
	live, err := readCheckpoints(ctx, r.pg, Name, false)
	if err != nil {
		return err
	}
	from, to := uint64(math.MaxUint64), uint64(0)
	bound := make([]uint64, len(workers))  // apply up to here; 0: nothing to apply
	floors := make([]uint64, len(workers)) // applied up to here
	for i, w := range workers {
		floors[i] = w.pos
		if b := live[w.p].seq; b > w.pos {
			bound[i] = b
			from, to = min(from, w.pos+1), max(to, b)
		}
	}
	if to == 0 {
		return nil
	}
	cons, err := logread.New(ctx, r.js, natsx.ReadingsStream, "", max(from, r.cfg.FromSeq, 1))
	if err != nil {
		return fmt.Errorf("READINGS: %w", err)
	}
	defer cons.Close(ctx)
	defer pending.Store(0)

	g, gctx := errgroup.WithContext(ctx)
	queues := make([]chan []jetstream.Msg, len(workers))
	for i, w := range workers {
		queues[i] = make(chan []jetstream.Msg, 2)
		w.sweeping = true
		g.Go(func() error {
			for msgs := range queues[i] {
				if err := w.apply(gctx, msgs, r.inPool); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer func() {
			for _, q := range queues {
				close(q)
			}
		}()
		return r.route(gctx, cons, to, floors, bound, queues, pending)
	})
	err = g.Wait()
	for i, w := range workers {
		w.sweeping = false
		if err == nil && bound[i] > 0 {
			w.pos = max(w.pos, bound[i]) // every message of the partition up to it is applied
		}
	}
	return err
}

// route reads cons up to seq to and sends each partition i's messages in (floors[i], bound[i]]
// to queues[i], in batches of the rebuild's batch size.
func (r *Rebuild) route(ctx context.Context, cons *logread.Reader, to uint64, floors, bound []uint64, queues []chan []jetstream.Msg, pending *atomic.Uint64) error {
	batches := make([][]jetstream.Msg, len(queues))
	send := func(i int) error {
		if len(batches[i]) == 0 {
			return nil
		}
		select {
		case queues[i] <- batches[i]:
			batches[i] = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for done := false; !done; {
		msgs, err := cons.Fetch(ctx, r.cfg.BatchSize, 200*time.Millisecond)
		if err != nil {
			return fmt.Errorf("fetch READINGS: %w", err)
		}
		left := cons.Pending()
		pending.Store(left)
		if len(msgs) == 0 && left == 0 {
			break // the stream ends before to: what it lost, the workers' own reads find lost too
		}
		for _, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("message metadata: %w", err)
			}
			seq := md.Sequence.Stream
			if done = seq >= to; seq > to {
				break
			}
			i, ok := natsx.ReadingsStoredPartition(m.Subject())
			if !ok || i >= len(queues) || seq <= floors[i] || seq > bound[i] {
				continue // another stream's subject, applied already, or past the live projection
			}
			if batches[i] = append(batches[i], m); len(batches[i]) >= r.cfg.BatchSize {
				if err := send(i); err != nil {
					return err
				}
			}
		}
	}
	for i := range batches {
		if err := send(i); err != nil {
			return err
		}
	}
	return nil
}
