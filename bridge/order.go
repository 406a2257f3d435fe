package bridge

import (
	"context"
	"sync/atomic"
)

// order keeps a sensor's readings in order in READINGS: a reading is appended only after
// the previous in-flight reading of the same sensor is durable. Without it, a failed append
// retried by the acker could land after a later reading of the same sensor that went
// through (per-sensor order is invariant 4). Different sensors still go in parallel.
type order struct {
	last   map[string]chan struct{}
	failed *atomic.Bool // the session failed: append nothing more, RabbitMQ will redeliver
	n      int
}

// wait blocks until sensor's previous reading is resolved; false means do not append.
func (o *order) wait(ctx context.Context, sensor string) bool {
	if prev, ok := o.last[sensor]; ok {
		select {
		case <-prev:
		case <-ctx.Done():
			return false
		}
	}
	return !o.failed.Load()
}

// track records done as sensor's latest in-flight reading, dropping resolved entries now
// and then so that the map holds about the in-flight window, not every sensor ever seen.
func (o *order) track(sensor string, done chan struct{}) {
	o.last[sensor] = done
	if o.n++; o.n%4096 == 0 {
		for k, ch := range o.last {
			select {
			case <-ch:
				delete(o.last, k)
			default:
			}
		}
	}
}
