package watchdog

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// markBatch is how many declared marks a worker takes from the queue at once.
const markBatch = 256

// job is a due expiry on its way to settle.
type job struct {
	sensor string
	c      candidate
}

// enqueue appends due expiries to the settle queue and starts workers for them, up to
// Concurrency at once. Queued and running sensors are in w.settling until their settle ends,
// so that a newer expiry of the same sensor stays held meanwhile: one sensor is never
// settled twice at once.
func (w *Watchdog) enqueue(ctx context.Context, readings jetstream.Stream, jobs []job) {
	if len(jobs) == 0 {
		return
	}
	w.mu.Lock()
	for _, j := range jobs {
		w.settling[j.sensor] = struct{}{}
	}
	w.queue = append(w.queue, jobs...)
	start := min(len(w.queue), w.cfg.Concurrency-w.workers)
	w.workers += start
	w.mu.Unlock()
	for range start {
		w.workersDone.Add(1)
		go w.settleWorker(ctx, readings)
	}
}

// settleWorker settles queued expiries, oldest first, then writes the declared marks they
// left (see declaredMark), until both queues are empty or ctx is done. A failed one is held again (unless a newer expiry came meanwhile) and counted for the
// declare loop's next warning; what is still queued when ctx ends is dropped with the
// process's ownership: the markers are replayed by whoever watches the partition next.
func (w *Watchdog) settleWorker(ctx context.Context, readings jetstream.Stream) {
	defer w.workersDone.Done()
	for {
		w.mu.Lock()
		if ctx.Err() != nil || len(w.queue) == 0 && len(w.marks) == 0 {
			w.workers--
			if w.workers == 0 {
				clear(w.settling)
				w.queue, w.marks = nil, nil // a burst's backing arrays go with them
			}
			w.mu.Unlock()
			return
		}
		if len(w.queue) == 0 {
			// Every queued expiry has its fact: now the keys' declared marks.
			n := min(len(w.marks), markBatch)
			marks := slices.Clone(w.marks[:n])
			clear(w.marks[:n])
			w.marks = w.marks[n:]
			w.mu.Unlock()
			for _, m := range marks {
				w.writeMark(ctx, m)
			}
			continue
		}
		j := w.queue[0]
		w.queue[0] = job{}
		w.queue = w.queue[1:]
		w.mu.Unlock()
		mark, err := w.settleDeferred(ctx, readings, j.sensor, j.c)
		w.mu.Lock()
		delete(w.settling, j.sensor)
		if mark != nil {
			w.marks = append(w.marks, *mark)
		}
		if err != nil {
			if _, ok := w.held[j.sensor]; !ok {
				w.held[j.sensor] = j.c
			}
			w.failed++
			if w.failedFirst == nil {
				w.failedFirst = err
			}
		}
		w.mu.Unlock()
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
