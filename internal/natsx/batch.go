package natsx

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// MaxAtomicBatch is the most messages the bridge and the outbox relays put in one atomic
// batch (nats-server's limit is 1,000).
const MaxAtomicBatch = 256

// MinAtomicBatch is the fewest messages worth an atomic batch to the outbox relays. The
// server stages each atomic batch of a file stream in a store of its own on disk, created
// with synced writes and removed at the commit, which costs far more than a few single
// appends; smaller batches are published one by one (a quiet system's events come one or two
// at a time). The bridge keeps atomic batches of any size (bridge/batch.go says why).
const MinAtomicBatch = 32

// PublishAtomic sends msgs (at most MaxAtomicBatch) as one atomic batch and waits up to
// timeout for its commit: the stream stores them all, as one run of sequences ending at the
// ack's, or none. A server that syncs every write syncs the batch once. msgs' headers get
// the batch's; jetstreamext checks that the ack names this batch and its size.
func PublishAtomic(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg, timeout time.Duration) (*jetstreamext.BatchAck, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return jetstreamext.PublishMsgBatch(ctx, js, msgs)
}

// AllowsAtomic says whether stream takes atomic batches (StreamsConfig.AtomicPublish).
func AllowsAtomic(ctx context.Context, js jetstream.JetStream, stream string) (bool, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err
	}
	return s.CachedInfo().Config.AllowAtomicPublish, nil
}
