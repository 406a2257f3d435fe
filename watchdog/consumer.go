package watchdog

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
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
	// consumerIdleWait is how long a read of an idle partition waits for a reading; a
	// delivery lost at the tail is noticed after it.
	consumerIdleWait = time.Second
)

// partState is one owned partition: its READINGS consumer's progress and the deadlines its
// refreshes wrote.
type partState struct {
	// lease is the context of the partition's Work: lease.Valid(lease) says it is still ours.
	lease context.Context
	// doneTS is the stored time (unix ns) of the last READINGS message whose refresh is
	// acknowledged: every reading stored before it has refreshed its key.
	doneTS atomic.Int64
	// doneSeq is the READINGS sequence of that message, on the stream named by stream.
	doneSeq atomic.Uint64

	// mu guards reader, written and writtenPeak: the partition's consumer goroutine sets
	// reader and records deadlines; the declare loop and the sweep ask reader for its
	// current consumer, the pruner and settle delete deadlines.
	mu     sync.Mutex
	reader *logread.Reader
	// written is, per sensor, the deadline (receive time + lost_after) of the last refresh
	// this process sent, in unix seconds rounded up. Only for coalescing: an entry missing
	// costs one key write more, never a missed expiry, so entries are dropped once their
	// deadline has passed. Key and value hold no pointer (see sensorKey), so a million
	// tracked sensors cost tens of MB (BenchmarkWrittenMap) and nothing for the GC to scan.
	written map[sensorKey]uint32
	// writtenPeak is the most entries since written was last made (see pruneWritten).
	writtenPeak int
	// stream is the identity of the READINGS stream the consumer reads (set when it
	// resumes, "" before), savedPos the position last written (position.go); mu guards them
	// and keeps doneSeq with its stream.
	stream   string
	savedPos position
	// replay is the part of READINGS that the consumer reads again and that may have been
	// applied before (replay.go); only the partition's consumer goroutine uses it.
	replay replayWindow
}

// consumer is the partition's READINGS consumer, nil before it was first created.
func (ps *partState) consumer() jetstream.Consumer {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.reader == nil {
		return nil
	}
	return ps.reader.Consumer()
}

// consume applies one partition of READINGS to the keys, reading it as contiguous runs
// (logread) and recreating its consumer on failure.
func (w *Watchdog) consume(ctx context.Context, p int, ps *partState) error {
	name := w.cfg.Durable + "-" + strconv.Itoa(p)
	spec := logread.Spec{
		Stream: natsx.ReadingsStream, Filter: natsx.ReadingsPartitionFilter(p), Durable: name,
		Description: "watchdog: refresh liveness keys",
		// AckAll: the acker acks in order, and the reader never hands out a message past
		// one that did not come, so an ack never covers a reading whose key was not written.
		AckPolicy: jetstream.AckAllPolicy, AckWait: consumerAckWait, MaxAckPending: consumerMaxAckPending,
		// The partition's position (position.go) is where it resumes, never the consumer's
		// state: kept in memory, the server does not rewrite its state file under load.
		MemoryStorage: true,
		OnGap:         w.gaps.OnGap(name),
	}
	for ctx.Err() == nil {
		if err := w.consumeWith(ctx, p, spec, ps); err != nil && ctx.Err() == nil {
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
	// lost is closed when the connection fut's ack is to come on is lost.
	lost <-chan struct{}
}

// consumeWith reads spec's consumer, starts each needed refresh asynchronously and hands
// every message to the acker in order. When the run breaks, the consumer is recreated only
// once the acker has done all it was handed, right after the last of them.
func (w *Watchdog) consumeWith(ctx context.Context, p int, spec logread.Spec, ps *partState) error {
	acks := make(chan pending, ackQueue)
	ackDone := make(chan error, 1)
	var handed, done atomic.Uint64 // messages handed to the acker, and done by it
	go func() { ackDone <- w.acker(ctx, acks, ps, &done) }()
	defer func() {
		close(acks)
		<-ackDone
	}()
	spec.Resume = w.resumeFunc(p, ps, spec.Durable, logread.AfterDrained(&handed, &done))
	r, err := logread.Open(ctx, w.js, spec)
	if err != nil {
		return fmt.Errorf("open READINGS consumer: %w", err)
	}
	ps.mu.Lock()
	ps.reader = r
	ps.mu.Unlock()
	for {
		msgs, err := r.Fetch(ctx, consumerPullBatch, consumerIdleWait)
		if err != nil {
			return fmt.Errorf("pull READINGS: %w", err)
		}
		for _, msg := range msgs {
			if err := w.handOver(ctx, msg, ps, acks); err != nil {
				return err
			}
			handed.Add(1)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// handOver checks msg, starts its refresh when one is needed, and queues it for the acker.
func (w *Watchdog) handOver(ctx context.Context, msg jetstream.Msg, ps *partState, acks chan<- pending) error {
	md, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("READINGS message metadata: %w", err)
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
	case l.Kind == event.KindReading && l.Untracked:
		// Beyond LOCKS_UNREGISTERED_MAX (the bridge's mark): no key, no memory.
		w.m.untracked.Inc()
	case l.Kind == event.KindReading && ps.replay.holds(md) && w.keyCovers(ctx, l.SensorID, l.ReceivedTime):
		w.m.replaySkips.Inc()
	case l.Kind == event.KindReading && !w.needsRefresh(ps, l.SensorID, l.ReceivedTime):
		w.m.coalesced.Inc()
	case l.Kind == event.KindReading:
		pd.put, pd.ttl = w.refreshMsg(l.SensorID, l.ReceivedTime, md.Sequence.Stream, time.Now())
		pd.lost = natsx.Lost(w.js.Conn())
		pd.fut, err = w.js.PublishMsgAsync(pd.put, jetstream.WithMsgTTL(pd.ttl))
		if err != nil {
			pd.fut = nil // the acker publishes it synchronously, with retries
		}
	}
	select {
	case acks <- pd:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
