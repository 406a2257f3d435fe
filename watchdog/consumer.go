package watchdog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// The READINGS consumer of a partition, and what its refreshes may have in flight.
const (
	consumerAckWait       = 30 * time.Second
	consumerMaxAckPending = 50000
	consumerPullBatch     = 2000
	// ackQueue is how many read messages may wait for their refresh before reading pauses.
	ackQueue = 4096
	// restartDelay is the pause before a failed consumer, watch or first overrides load is
	// tried again.
	restartDelay = time.Second
)

// partState is one owned partition: its READINGS consumer's progress and the deadlines its
// refreshes wrote.
type partState struct {
	// lease is the context of the partition's Work: lease.Valid(lease) says it is still ours.
	lease context.Context
	// doneTS is the stored time (unix ns) of the last READINGS message whose refresh is
	// acknowledged: every reading stored before it has refreshed its key.
	doneTS atomic.Int64
	// doneSeq is the READINGS sequence of that message.
	doneSeq atomic.Uint64

	// mu guards cons, written and writtenPeak: the partition's consumer goroutine sets cons
	// and records deadlines; the declare loop and the sweep read cons, the pruner and settle
	// delete deadlines.
	mu   sync.Mutex
	cons jetstream.Consumer
	// written is, per sensor, the deadline (receive time + lost_after) of the last refresh
	// this process sent, in unix seconds rounded up. Only for coalescing: an entry missing
	// costs one key write more, never a missed expiry, so entries are dropped once their
	// deadline has passed. Key and value hold no pointer (see sensorKey), so a million
	// tracked sensors cost about 44 MB (BenchmarkWrittenMap) and nothing for the GC to scan.
	written map[sensorKey]uint32
	// writtenPeak is the most entries since written was last made (see pruneWritten).
	writtenPeak int
}

// consumer is the partition's READINGS consumer, nil before it was first created.
func (ps *partState) consumer() jetstream.Consumer {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.cons
}

// consume applies one partition of READINGS to the keys, recreating its consumer on failure.
func (w *Watchdog) consume(ctx context.Context, p int, ps *partState) error {
	name := w.cfg.Durable + "-" + strconv.Itoa(p)
	for ctx.Err() == nil {
		cons, err := w.js.CreateOrUpdateConsumer(ctx, natsx.ReadingsStream, jetstream.ConsumerConfig{
			Durable:       name,
			Description:   "watchdog: refresh liveness keys",
			FilterSubject: natsx.ReadingsPartitionFilter(p),
			AckPolicy:     jetstream.AckAllPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			AckWait:       consumerAckWait,
			MaxAckPending: consumerMaxAckPending,
		})
		if err != nil {
			w.log.Warn("create READINGS consumer; retrying", "consumer", name, "err", err)
			backoff.Sleep(ctx, restartDelay)
			continue
		}
		ps.mu.Lock()
		ps.cons = cons
		ps.mu.Unlock()
		if err := w.consumeWith(ctx, cons, ps); err != nil && ctx.Err() == nil {
			w.log.Warn("READINGS consumer stopped; restarting it", "consumer", name, "err", err)
			backoff.Sleep(ctx, restartDelay)
		}
	}
	return nil
}

// pending is a READINGS message on its way to the acker, with its refresh (if any).
type pending struct {
	msg      jetstream.Msg
	fut      jetstream.PubAckFuture // nil: nothing to wait for
	put      *nats.Msg
	ttl      time.Duration
	storedNS int64
	seq      uint64
}

// consumeWith reads cons, starts each needed refresh asynchronously and hands every message
// to the acker in order.
func (w *Watchdog) consumeWith(ctx context.Context, cons jetstream.Consumer, ps *partState) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(consumerPullBatch))
	if err != nil {
		return fmt.Errorf("pull READINGS: %w", err)
	}
	defer it.Stop()
	acks := make(chan pending, ackQueue)
	ackDone := make(chan error, 1)
	go func() { ackDone <- w.acker(ctx, acks, ps) }()
	defer func() {
		close(acks)
		<-ackDone
	}()
	stopOnCancel := context.AfterFunc(ctx, it.Stop)
	defer stopOnCancel()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("pull READINGS: %w", err) // recreated by consume
			}
			w.log.Debug("READINGS iterator", "err", err)
			continue
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		pd := pending{msg: msg, storedNS: md.Timestamp.UnixNano(), seq: md.Sequence.Stream}
		l, err := event.CheckLog(msg.Subject(), msg.Data(), w.cfg.PartitionCount)
		switch {
		case err != nil:
			// Set aside before the acker can ack past it: a forged id would otherwise
			// refresh (or fail to refresh, forever) a key that is no sensor's.
			if err := w.setAside.SetAside(ctx, natsx.ReadingsStream, md.Sequence.Stream, msg.Subject(), msg.Data(), err); err != nil {
				return err
			}
		case l.Kind == event.KindReading && !w.needsRefresh(ps, l.SensorID, l.ReceivedTime):
			w.m.coalesced.Inc()
		case l.Kind == event.KindReading:
			pd.put, pd.ttl = w.refreshMsg(l.SensorID, l.ReceivedTime, md.Sequence.Stream, time.Now())
			pd.fut, err = w.js.PublishMsgAsync(pd.put, jetstream.WithMsgTTL(pd.ttl))
			if err != nil {
				pd.fut = nil // the acker publishes it synchronously, with retries
			}
		}
		select {
		case acks <- pd:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
