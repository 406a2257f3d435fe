package state

import (
	"context"
	"errors"
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

// Bounds of the delay between retries of a partition (and of its relay) after a failure:
// short enough that a partition resumes within a second of NATS or Postgres coming back.
const (
	retryMin = 100 * time.Millisecond
	retryMax = time.Second
)

func consumerName(p int) string { return "state-p" + strconv.Itoa(p) }

// partitionWorker follows one partition. It reads READINGS as contiguous runs (logread) that
// resume after the Postgres checkpoint whenever the run breaks (a lost delivery after a NATS
// restart, a redelivery, an error), so messages are always applied in stream order and none
// is skipped.
type partitionWorker struct {
	s     *Projector
	p     int
	log   *slog.Logger
	epoch int64 // this process's ownership of p, checked in each batch's transaction
	r     *logread.Reader
	cache *rowCache
}

// runPartition follows p as the owner of epoch until ctx is done (nil) or a batch is fenced
// (an error wrapping lease.ErrFenced: another process owns p now).
func (s *Projector) runPartition(ctx context.Context, p int, epoch int64) error {
	w := &partitionWorker{s: s, p: p, epoch: epoch, log: s.log.With("partition", p), cache: newRowCache(s.cfg.CacheSensors)}
	// Transient failures (a database or NATS away) are retried without end, waiting longer
	// each time up to retryMax.
	retry := backoff.New(retryMin, retryMax)
	defer w.flushAtStop(ctx)
	for ctx.Err() == nil {
		if err := w.flushSeen(ctx); err != nil {
			if errors.Is(err, lease.ErrFenced) {
				return err
			}
			// On to the fetch, which says why if the checkpoint no longer fits READINGS
			// (resume) and else waits for Postgres with the batch.
			w.log.Warn("write pending liveness", "err", err)
			if w.r != nil {
				w.r.Reopen()
			}
			retry.Wait(ctx)
		}
		msgs, err := w.fetch(ctx)
		if err != nil {
			var mm *CheckpointMismatchError
			switch {
			case errors.As(err, &mm):
				// Stopped loudly, and looked at again (up to every second) for the store
				// to come back or the checkpoints to be rebased; other partitions go on.
				s.refused.refuse(mm)
			case ctx.Err() == nil:
				w.log.Warn("read READINGS", "err", err)
			}
			retry.Wait(ctx)
			continue
		}
		s.refused.clear(p)
		if len(msgs) == 0 {
			retry.Reset()
			continue
		}
		w.setLag(msgs[len(msgs)-1])
		// A batch under way is finished even when asked to stop: it is one transaction
		// and one ack, and stopping between them only costs a redelivery.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.AckWait/2)
		err = s.applyBatch(actx, p, w.epoch, msgs, w.cache)
		if err == nil {
			crashpoint.Hit(CrashAfterCommit)
			// AckAll: the last message acks the batch, and the run holds no gap. Not waited
			// for: the server takes it before this connection's next pull, and a lost one
			// (NATS restarting) only comes back as a redelivery, which makes the reader resume
			// from the checkpoint, as does the lost connection itself.
			if aerr := msgs[len(msgs)-1].Ack(); aerr != nil {
				w.log.Debug("ack batch; the consumer will be recreated from the checkpoint", "err", aerr)
				w.r.Reopen()
			}
		}
		cancel()
		if errors.Is(err, lease.ErrFenced) {
			// Rolled back: the new owner applies these messages; they are not acked here.
			return err
		}
		if err != nil {
			w.log.Warn("apply batch", "err", err, "messages", len(msgs))
			w.r.Reopen()
			retry.Wait(ctx)
			continue
		}
		retry.Reset()
	}
	return nil
}

// flushSeen writes the partition's pending liveness when it is due (seen.go); batches write
// it as well, so this is what an idle partition does. When the memory was lost (at start,
// after a failed transaction) and the checkpoint says liveness was deferred, it replays
// that at once rather than with the next reading, which may be long in coming.
func (w *partitionWorker) flushSeen(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.s.cfg.AckWait/2)
	defer cancel()
	if w.cache.stale {
		if w.cache.stream == "" {
			// Not before the consumer has checked that the checkpoint belongs to READINGS
			// (resume, at the first fetch): the replay reads READINGS from it.
			return nil
		}
		ck, err := readCheckpoint(fctx, w.s.pg, Name, w.p)
		if err != nil {
			return err
		}
		if ck.seen >= ck.seq {
			w.cache.stale = false // the next batch loads what it needs
			return nil
		}
		return w.s.flushSeen(fctx, w.p, w.epoch, w.cache)
	}
	if w.s.cfg.SeenInterval == 0 || !w.cache.seenDue(w.s.clock.Now(), w.s.cfg.SeenInterval) {
		return nil
	}
	return w.s.flushSeen(fctx, w.p, w.epoch, w.cache)
}

// flushAtStop writes the pending liveness when the partition stops cleanly, so that the next
// owner has none to replay; after a crash the next owner replays it from READINGS instead.
func (w *partitionWorker) flushAtStop(ctx context.Context) {
	if ctx.Err() == nil || len(w.cache.pending) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.s.flushSeen(fctx, w.p, w.epoch, w.cache); err != nil {
		w.log.Info("pending liveness not written at stop; the next owner replays it from READINGS", "err", err)
	}
}

// resume is where the partition's consumer starts, once the checkpoint is known to belong
// to READINGS (a *CheckpointMismatchError otherwise): right after the checkpoint.
func (w *partitionWorker) resume(ctx context.Context) (uint64, error) {
	ck, err := readCheckpoint(ctx, w.s.pg, Name, w.p)
	if err != nil {
		return 0, err
	}
	pos, err := readingsPosition(ctx, w.s.js)
	if err != nil {
		return 0, err
	}
	if err := checkCheckpoint(Name, w.p, ck.seq, ck.stream, pos); err != nil {
		return 0, err
	}
	if c := w.cache; !c.stale && c.ahead() && c.cp == ck.seq && c.stream == pos.id && c.applied <= pos.lastSeq {
		// The run broke while memory held readings beyond the checkpoint this process left,
		// which the stream still has: they are not read again, and their deferred liveness
		// stays in memory rather than being dropped and replayed from READINGS.
		w.log.Debug("READINGS consumer starts after the readings applied in memory", "checkpoint", ck.seq, "applied", c.applied)
		return c.applied + 1, nil
	}
	// The batches' transactions hold the checkpoint to this stream.
	if w.cache.stream != pos.id {
		w.cache.counted = 0 // another stream numbers its readings afresh
	}
	w.cache.stream = pos.id
	w.log.Debug("READINGS consumer starts after the checkpoint", "checkpoint", ck.seq)
	return ck.seq + 1, nil
}

// fetch returns what is there at once, up to a batch; when nothing is, it waits up to
// IdleWait for one message and then takes what has come with it.
func (w *partitionWorker) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	if w.r == nil {
		name := consumerName(w.p)
		r, err := logread.Open(ctx, w.s.js, logread.Spec{
			Stream: natsx.ReadingsStream, Filter: natsx.ReadingsPartitionFilter(w.p), Durable: name,
			Description: "state projector, partition " + strconv.Itoa(w.p),
			AckPolicy:   jetstream.AckAllPolicy, AckWait: w.s.cfg.AckWait, MaxAckPending: 4 * w.s.cfg.BatchSize,
			// The checkpoint in Postgres is where the partition resumes, never the
			// consumer's state: kept in memory, the server does not rewrite its state file
			// ten times a second under load.
			MemoryStorage: true,
			Resume:        w.resume,
			OnGap:         w.s.gaps.OnGap(name),
		})
		if err != nil {
			return nil, err
		}
		w.r = r
	}
	wait := w.s.cfg.IdleWait
	switch {
	case w.cache.stale:
		// Back at once for flushSeen's replay, now that the checkpoint is checked.
		wait = 0
	case w.s.cfg.SeenInterval > 0:
		// Awake when the pending liveness is due, to write it.
		wait = w.cache.seenWait(w.s.clock.Now(), w.s.cfg.SeenInterval, wait)
	}
	msgs, err := w.r.Fetch(ctx, w.s.cfg.BatchSize, wait)
	if err == nil && len(msgs) == 0 {
		if info := w.r.IdleInfo(); info != nil {
			w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(info.NumPending))
			if info.NumPending == 0 {
				w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(0)
			}
		}
	}
	return msgs, err
}

// setLag sets the partition's lag from the last message of a batch.
func (w *partitionWorker) setLag(last jetstream.Msg) {
	if md, err := last.Metadata(); err == nil {
		w.s.m.lag.WithLabelValues(strconv.Itoa(w.p)).Set(float64(md.NumPending))
		w.s.m.lagSeconds.WithLabelValues(strconv.Itoa(w.p)).Set(time.Since(md.Timestamp).Seconds())
	}
}
