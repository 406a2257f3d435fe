package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
)

// sharedConsumer is the shared DELIVERIES consumer and the identity of its stream.
type sharedConsumer struct {
	cons   jetstream.Consumer
	stream string
}

// consume feeds the shared DELIVERIES consumer's messages to its sink until ctx is done,
// opening the consumer again whenever it is gone (NATS restarted: it lived in memory).
func (h *Projector) consume(ctx, sinkCtx context.Context, src *source, s *sink) error {
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		cons, err := h.openShared(ctx, s, src)
		if err == nil {
			began := time.Now()
			if err = h.consumeShared(ctx, sinkCtx, cons, src, s); err == nil {
				return nil
			}
			if time.Since(began) > time.Minute {
				retry.Reset() // read well for a while: the waits start short again
			}
		}
		if ctx.Err() == nil {
			h.log.Warn("history: reading DELIVERIES; opening its consumer again", "consumer", src.durable, "err", err)
			retry.Wait(ctx)
		}
	}
	return nil
}

// openShared returns the DELIVERIES consumer that every history process shares, creating it
// when none is there (the first process, or NATS restarted and the memory consumer is gone)
// after the position in ClickHouse: the ack floor some process wrote after the rows, so
// never past a message not written. A file-backed consumer left by an earlier version is
// replaced by a memory one at its ack floor.
func (h *Projector) openShared(ctx context.Context, s *sink, src *source) (jetstream.Consumer, error) {
	st, err := streamNow(ctx, h.js, src.stream)
	if err != nil {
		return nil, err
	}
	cfg := h.consumerConfig(s, src)
	var p position
	cons, err := h.js.Consumer(ctx, src.stream, src.durable)
	switch {
	case err == nil && cons.CachedInfo().Config.MemoryStorage:
		if c := cons.CachedInfo().Config; c.AckWait != cfg.AckWait || c.MaxAckPending != cfg.MaxAckPending {
			c.AckWait, c.MaxAckPending = cfg.AckWait, cfg.MaxAckPending
			if cons, err = h.js.UpdateConsumer(ctx, src.stream, c); err != nil {
				return nil, fmt.Errorf("update consumer %s: %w", src.durable, err)
			}
		}
		src.shared.Store(&sharedConsumer{cons: cons, stream: st.ID})
		return cons, nil
	case err == nil:
		p = position{stream: st.ID, seq: cons.CachedInfo().AckFloor.Stream}
		if err := h.js.DeleteConsumer(ctx, src.stream, src.durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("replace the file-backed consumer %s: %w", src.durable, err)
		}
		h.log.Info("history: the file-backed DELIVERIES consumer is replaced by a memory one at its ack floor",
			"consumer", src.durable, "ack_floor", p.seq)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		ps, err := readPositions(ctx, h.ch, []string{src.durable})
		if err != nil {
			return nil, err
		}
		p = ps[src.durable]
	default:
		return nil, fmt.Errorf("consumer %s: %w", src.durable, err)
	}
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, h.startFrom(ctx, src, s.table.name, p, st)
	cons, err = h.js.CreateConsumer(ctx, src.stream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Another history process made it meanwhile, from a position as safe as this one.
		cons, err = h.js.Consumer(ctx, src.stream, src.durable)
	}
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", src.durable, err)
	}
	src.shared.Store(&sharedConsumer{cons: cons, stream: st.ID})
	return cons, nil
}

// sharedHeartbeat is how often the server says an idle pull of DELIVERIES is alive; two
// missed mean the consumer is gone (NATS restarted) or unreachable, and it is opened again.
const sharedHeartbeat = 2 * time.Second

// consumeShared feeds cons's messages to the sink until ctx is done, then drains what the
// client already pulled so that those messages are written now rather than redelivered
// later: nil. Its messages are split between the history processes, so its consumer
// sequence has gaps by design: a lost one comes again after AckWait. An error: the consumer
// is gone or silent, to be opened again.
func (h *Projector) consumeShared(ctx, sinkCtx context.Context, cons jetstream.Consumer, src *source, s *sink) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(min(h.cfg.BatchSize, 2000)),
		jetstream.PullHeartbeat(sharedHeartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return fmt.Errorf("consume %s: %w", src.durable, err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	// A drain that cannot finish (NATS unreachable) is cut when the grace ends.
	stopHard := context.AfterFunc(sinkCtx, it.Stop)
	defer stopHard()
	defer it.Stop()
	for {
		msg, err := it.Next()
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrMsgIteratorClosed), errors.Is(err, jetstream.ErrNoHeartbeat),
			errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("consumer %s: %w", src.durable, err)
		case err != nil:
			h.log.Warn("history: pulling messages", "consumer", src.durable, "err", err)
			continue
		}
		it, ok := h.decode(sinkCtx, msg, src, s)
		if !ok {
			return nil
		}
		select {
		case s.in <- it:
		case <-sinkCtx.Done():
			return nil
		}
	}
}
