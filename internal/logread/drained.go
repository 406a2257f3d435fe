package logread

import (
	"context"
	"sync/atomic"
	"time"
)

// AfterDrained is the Spec.Resume of a part that processes what it reads in a pipeline:
// handed counts the messages given to the pipeline, done those it has finished (acked). A
// broken run is resumed only once done has caught up, and then right after the last message
// handed out, so an ack still in the pipeline never lands on a consumer that starts past it
// unprocessed.
func AfterDrained(handed, done *atomic.Uint64) func(context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		for done.Load() < handed.Load() {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return 0, nil // the Reader's own position: right after the last message handed out
	}
}
