package state

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/nats-io/nats.go/jetstream"
)

// Bounds of the delay between retries of a partition (and of its relay) after a failure.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 3 * time.Second
)

func consumerName(p int) string { return "state-p" + strconv.Itoa(p) }

// partitionWorker follows one partition. Its consumer is a cursor over READINGS that starts at
// the Postgres checkpoint; whenever delivery is not the plain next message (a redelivery,
// a lost delivery after a NATS restart, an error), the consumer is recreated from the
// checkpoint, so messages are always applied in stream order and none is skipped.
type partitionWorker struct {
	s     *Projector
	p     int
	log   *slog.Logger
	epoch int64 // this process's ownership of p, checked in each batch's transaction
	cons  jetstream.Consumer
	next  uint64 // the consumer sequence expected next
	cache *rowCache
}

// runPartition follows p as the owner of epoch until ctx is done (nil) or a batch is fenced
// (an error wrapping lease.ErrFenced: another process owns p now).
func (s *Projector) runPartition(ctx context.Context, p int, epoch int64) error {
	w := &partitionWorker{s: s, p: p, epoch: epoch, log: s.log.With("partition", p), cache: newRowCache(s.cfg.CacheSensors)}
	// Transient failures (a database or NATS away) are retried without end, waiting longer
	// each time up to retryMax.
	retry := backoff.New(retryMin, retryMax)
	for ctx.Err() == nil {
		if w.cons == nil {
			if err := w.reset(ctx); err != nil {
				var mm *CheckpointMismatchError
				switch {
				case errors.As(err, &mm):
					// Stopped loudly, and looked at again (up to every 3 s) for the store
					// to come back or the checkpoints to be rebased; other partitions go on.
					s.refused.refuse(mm)
				case ctx.Err() == nil:
					w.log.Warn("recreate READINGS consumer", "err", err)
				}
				retry.Wait(ctx)
				continue
			}
			s.refused.clear(p)
		}
		msgs, err := w.fetch(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("fetch from READINGS", "err", err)
				w.cons = nil
				retry.Wait(ctx)
			}
			continue
		}
		if len(msgs) == 0 {
			continue
		}
		good, gap := w.inOrder(msgs)
		if len(good) > 0 {
			// A batch under way is finished even when asked to stop: it is one transaction
			// and one ack, and stopping between them only costs a redelivery.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AckWait/2)
			err := s.applyBatch(actx, p, w.epoch, good, w.cache)
			if err == nil {
				crashpoint.Hit(CrashAfterCommit)
				s.nudge(p)
				// AckAll: the last message acks the batch. A lost ack reply (NATS restarting)
				// must not hold the partition: the checkpoint makes a missing ack harmless.
				ackCtx, ackCancel := context.WithTimeout(actx, 5*time.Second)
				aerr := good[len(good)-1].DoubleAck(ackCtx)
				ackCancel()
				if aerr != nil {
					w.log.Debug("ack batch; the consumer will be recreated from the checkpoint", "err", aerr)
					gap = true
				}
			}
			cancel()
			if errors.Is(err, lease.ErrFenced) {
				// Rolled back: the new owner applies these messages; they are not acked here.
				return err
			}
			if err != nil {
				w.log.Warn("apply batch", "err", err, "messages", len(good))
				w.cons = nil
				retry.Wait(ctx)
				continue
			}
		}
		retry.Reset()
		if gap {
			w.cons = nil
		}
	}
	return nil
}

// reset recreates the partition's durable consumer to start right after the checkpoint,
// once the checkpoint is known to belong to READINGS (a *CheckpointMismatchError otherwise).
func (w *partitionWorker) reset(ctx context.Context) error {
	ck, err := readCheckpoint(ctx, w.s.pg, Name, w.p)
	cp := ck.seq
	if err != nil {
		return err
	}
	pos, err := readingsPosition(ctx, w.s.js)
	if err != nil {
		return err
	}
	if err := checkCheckpoint(Name, w.p, cp, ck.stream, pos); err != nil {
		return err
	}
	// The batches' transactions hold the checkpoint to this stream.
	w.cache.stream = pos.id
	name := consumerName(w.p)
	if err := w.s.js.DeleteConsumer(ctx, natsx.ReadingsStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s: %w", name, err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "state projector, partition " + strconv.Itoa(w.p),
		FilterSubject: natsx.ReadingsPartitionFilter(w.p),
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       w.s.cfg.AckWait,
		MaxAckPending: 4 * w.s.cfg.BatchSize,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// The checkpoint in Postgres is where the partition resumes, never the consumer's
		// state: kept in memory, the server does not rewrite its state file ten times a
		// second under load; a consumer lost with a NATS restart is recreated (fetch fails).
		MemoryStorage: true,
	}
	if cp > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cp+1
	}
	cons, err := w.s.js.CreateConsumer(ctx, natsx.ReadingsStream, cfg)
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", name, err)
	}
	w.cons, w.next = cons, 1
	w.log.Debug("READINGS consumer starts after the checkpoint", "checkpoint", cp)
	return nil
}

// fetch returns what is there at once, up to a batch; when nothing is, it waits up to
// IdleWait for one message and then takes what has come with it.
func (w *partitionWorker) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	batch := w.s.cfg.BatchSize
	msgs, err := logread.Drain(w.cons.FetchNoWait(batch))
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	fctx, cancel := context.WithTimeout(ctx, w.s.cfg.IdleWait)
	msgs, err = logread.Drain(w.cons.Fetch(1, jetstream.FetchContext(fctx)))
	cancel()
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		// Idle: messages delivered to us but lost (a NATS restart) would wait for AckWait;
		// the consumer's pending count shows them now.
		info, err := w.cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer info: %w", err)
		}
		w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(info.NumPending))
		if info.NumPending == 0 {
			w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(0)
		}
		if info.NumAckPending > 0 {
			w.cons = nil
		}
		return nil, nil
	}
	if batch > 1 {
		more, err := logread.Drain(w.cons.FetchNoWait(batch - 1))
		if err != nil {
			// Keep the first; the error shows again on the next fetch.
			return msgs, nil
		}
		msgs = append(msgs, more...)
	}
	return msgs, nil
}

// inOrder keeps the prefix of msgs that are first deliveries in consumer order; gap says
// something else came and the consumer must be recreated.
func (w *partitionWorker) inOrder(msgs []jetstream.Msg) ([]jetstream.Msg, bool) {
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil || md.NumDelivered != 1 || md.Sequence.Consumer != w.next {
			return msgs[:i], true
		}
		w.next++
		if i == len(msgs)-1 {
			w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(md.NumPending))
			w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(time.Since(md.Timestamp).Seconds())
		}
	}
	return msgs, false
}
