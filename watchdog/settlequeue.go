package watchdog

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// markBatch is how many declared marks a worker takes from the queue at once.
const markBatch = 256

// job is a due expiry on its way to settle.
type job struct {
	sensor string
	c      candidate
}

// enqueue appends due expiries to the settle queue and starts workers for them. Queued and
// running sensors are in w.settling until their settle ends, so that a newer expiry of the
// same sensor stays held meanwhile: one sensor is never settled twice at once.
func (w *Watchdog) enqueue(ctx context.Context, readings jetstream.Stream, jobs []job) {
	if len(jobs) == 0 {
		return
	}
	batch, most := w.batching()
	w.mu.Lock()
	for _, j := range jobs {
		w.settling[j.sensor] = struct{}{}
	}
	w.queue = append(w.queue, jobs...)
	w.m.queued.Set(float64(len(w.queue)))
	start := min((len(w.queue)+batch-1)/batch, most-w.workers)
	w.workers += start
	w.mu.Unlock()
	for range start {
		w.workersDone.Add(1)
		go w.settleWorker(ctx, readings)
	}
}

// batching is how many expiries a worker settles at once, and how many workers may run:
// together at most Concurrency settles at once.
func (w *Watchdog) batching() (batch, workers int) {
	batch = min(lookupBatch, w.cfg.Concurrency)
	return batch, max(1, w.cfg.Concurrency/batch)
}

// settleWorker settles queued expiries, oldest first and a batch at a time, then writes the
// declared marks they left (see declaredMark), until both queues are empty or ctx is done.
// A failed settle is held again (unless a newer expiry came meanwhile) and counted for the
// declare loop's next warning; what is still queued when ctx ends is dropped with the
// process's ownership: the markers are replayed by whoever watches the partition next.
func (w *Watchdog) settleWorker(ctx context.Context, readings jetstream.Stream) {
	defer w.workersDone.Done()
	batch, _ := w.batching()
	for {
		w.mu.Lock()
		if ctx.Err() != nil || len(w.queue) == 0 && len(w.marks) == 0 {
			w.workers--
			if w.workers == 0 {
				clear(w.settling)
				w.queue, w.marks = nil, nil // a burst's backing arrays go with them
				w.m.queued.Set(0)
			}
			w.mu.Unlock()
			return
		}
		if len(w.queue) == 0 {
			// Every queued expiry has its fact: now the keys' declared marks.
			marks := take(&w.marks, markBatch)
			w.mu.Unlock()
			for _, m := range marks {
				w.writeMark(ctx, m)
			}
			continue
		}
		jobs := take(&w.queue, batch)
		w.m.queued.Set(float64(len(w.queue)))
		w.mu.Unlock()
		w.settleBatch(ctx, readings, jobs)
	}
}

// take removes and returns up to n entries from the head of *q.
func take[T any](q *[]T, n int) []T {
	n = min(n, len(*q))
	out := slices.Clone((*q)[:n])
	clear((*q)[:n])
	*q = (*q)[n:]
	return out
}

// settleBatch settles jobs at once: one lookup of their sensors' last messages, then each
// decided in its own goroutine, so that their facts' acknowledgements are awaited together.
// When the batched lookup fails (a server without multi_last, say), each is looked up alone.
func (w *Watchdog) settleBatch(ctx context.Context, readings jetstream.Stream, jobs []job) {
	sensors := make([]string, len(jobs))
	for i, j := range jobs {
		sensors[i] = j.sensor
	}
	last, lookupErr := w.lastMsgs(ctx, sensors)
	if lookupErr != nil && ctx.Err() == nil {
		w.log.Debug("batched lookup of last READINGS messages failed; looking up one by one", "err", lookupErr)
	}
	type outcome struct {
		mark *declaredMark
		err  error
	}
	out := make([]outcome, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			switch m, found := last[j.sensor]; {
			case lookupErr != nil:
				out[i].mark, out[i].err = w.settleDeferred(ctx, readings, j.sensor, j.c)
			case found:
				out[i].mark, out[i].err = w.decide(ctx, j.sensor, j.c, m)
			}
			// Not found: nothing was ever read from it, nothing to declare.
		})
	}
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, j := range jobs {
		delete(w.settling, j.sensor)
		if out[i].mark != nil {
			w.marks = append(w.marks, *out[i].mark)
		}
		if err := out[i].err; err != nil {
			if _, ok := w.held[j.sensor]; !ok {
				w.held[j.sensor] = j.c
			}
			w.failed++
			if w.failedFirst == nil {
				w.failedFirst = err
			}
		}
	}
}

// takeFailures reports (and forgets) the settles that failed since it was last asked.
func (w *Watchdog) takeFailures() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed == 0 {
		return nil
	}
	err := fmt.Errorf("%d expiries will be retried: %w", w.failed, w.failedFirst)
	w.failed, w.failedFirst = 0, nil
	return err
}
