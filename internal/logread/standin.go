package logread

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A durable consumer is a raft group of its own on a clustered stream. When its leader dies
// with a NATS node, it answers nothing, not even its deletion, until the group elects a new
// leader, which can take longer than the stream's own election. A part does not wait for it:
// it reads through a stand-in, an unnamed consumer created at the same position (a name
// only the server and this reader know, so no other part can touch it), and goes back to its
// durable at a later reopen, standInFor after, when the durable answers again.
const (
	// durableDeleteTimeout bounds the deletion of a part's durable before it is recreated: a
	// healthy server answers in milliseconds.
	durableDeleteTimeout = time.Second
	// standInFor is how long a reader stays on a stand-in before it tries its durable again.
	standInFor = time.Minute
	// standInInactive is how long the server keeps a stand-in nobody reads: one left behind
	// by a process that died goes by itself.
	standInInactive = 30 * time.Second
)

// deleteDurable deletes the part's durable so that it can be created again at the position
// to resume from. It reports standIn when the durable did not answer in time: the reader
// then creates a stand-in instead.
func (r *Reader) deleteDurable(ctx context.Context) (standIn bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, durableDeleteTimeout)
	err = r.js.DeleteConsumer(dctx, r.spec.Stream, r.spec.Durable)
	cancel()
	switch {
	case err == nil || errors.Is(err, jetstream.ErrConsumerNotFound):
		return false, nil
	case ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)):
		if r.spec.OnGap != nil {
			r.spec.OnGap("consumer " + r.spec.Durable + " did not answer its deletion (no leader?); reading through a stand-in")
		}
		return true, nil
	}
	return false, fmt.Errorf("delete consumer %s: %w", r.spec.Durable, err)
}

// dropOwn deletes a consumer of this reader's own (a rebuild's, or a stand-in) without
// waiting for it: the server removes it anyway once it is inactive.
func (r *Reader) dropOwn(name string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), durableOpenTimeout)
		defer cancel()
		_ = r.js.DeleteConsumer(ctx, r.spec.Stream, name)
	}()
}

// backToDurable reports whether a reader on a stand-in should try its durable again now.
func (r *Reader) backToDurable() bool {
	return r.standIn && time.Since(r.standInSince) >= standInFor
}
