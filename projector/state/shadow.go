package state

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lock-sensors/lock-sensors/internal/crashpoint"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/nats-io/nats.go/jetstream"
)

// shadowWorker applies one partition to the shadow. Its rows are the shadow's rows of the
// partition as last committed; cp is the last sequence committed, pos the sequence up to
// which the partition is known applied (beyond cp when the next message is further on).
type shadowWorker struct {
	r       *Rebuild
	p       int
	rows    map[string]row
	cp, pos uint64
	cons    *logread.Reader // opened at the first fetch, after the sweep
	held    []jetstream.Msg // fetched, beyond the target
	check   *eventChecker
	done    atomic.Uint64
	pending atomic.Uint64
	// sweeping: the batches come from the sweep's unfiltered consumer, whose pending count
	// is not the partition's.
	sweeping bool
}

// open loads the shadow's rows and checkpoint of the partition and opens a logReader on
// its EVENTS, for the checks.
func (w *shadowWorker) open(ctx context.Context) error {
	r := w.r
	cp, err := readCheckpoint(ctx, r.pg, ShadowName, w.p)
	if err != nil {
		return err
	}
	w.cp, w.pos = cp.seq, cp.seq
	rows, err := r.pg.Query(ctx, `SELECT sensor_id, data, last_seen, last_reading_time, changed_at, revision, connection, last_seq
		FROM `+ShadowTable+` WHERE partition = $1`, w.p)
	if err != nil {
		return fmt.Errorf("load %s: %w", ShadowTable, err)
	}
	if err := scanRows(rows, w.rows); err != nil {
		return err
	}
	w.check.cons, err = logread.New(ctx, r.js, natsx.EventsStream, natsx.EventsPartitionFilter(w.p), 1)
	if err != nil {
		return fmt.Errorf("EVENTS of partition %d: %w", w.p, err)
	}
	return nil
}

// close deletes the worker's consumers.
func (w *shadowWorker) close(ctx context.Context) {
	if w.cons != nil {
		w.cons.Close(ctx)
	}
	if w.check != nil && w.check.cons != nil {
		w.check.cons.Close(ctx)
	}
}

// follow applies the partition up to the live checkpoint, again and again, until it is
// within SwapTail of it.
func (w *shadowWorker) follow(ctx context.Context) error {
	for {
		live, err := readCheckpoints(ctx, w.r.pg, Name, false)
		if err != nil {
			return err
		}
		target := live[w.p].seq
		if target < w.cp {
			return fmt.Errorf("partition %d: the shadow (seq %d) is ahead of the live projection (seq %d): was the live checkpoint reset?", w.p, w.cp, target)
		}
		if target <= w.pos || target-w.pos <= w.r.cfg.SwapTail {
			return nil
		}
		if err := w.applyUpTo(ctx, target, w.r.inPool); err != nil {
			return err
		}
	}
}

// applyUpTo applies the partition's messages up to seq target, one transaction (run by
// inTx) per batch.
func (w *shadowWorker) applyUpTo(ctx context.Context, target uint64, inTx func(context.Context, func(pgx.Tx) error) error) error {
	for w.pos < target {
		if err := ctx.Err(); err != nil {
			return err
		}
		msgs := w.held
		w.held = nil
		if len(msgs) == 0 {
			var err error
			if msgs, err = w.fetch(ctx); err != nil {
				return err
			}
		}
		cut := len(msgs)
		for i, m := range msgs {
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("message metadata: %w", err)
			}
			if md.Sequence.Stream > target {
				cut = i
				break
			}
		}
		if cut < len(msgs) {
			w.held = msgs[cut:]
		}
		if cut > 0 {
			if err := w.apply(ctx, msgs[:cut], inTx); err != nil {
				return err
			}
		}
		if len(w.held) > 0 {
			// The partition's next message is past the target: applied up to it.
			w.pos = target
		}
	}
	return nil
}

func (w *shadowWorker) fetch(ctx context.Context) ([]jetstream.Msg, error) {
	if w.cons == nil {
		// The partition's own consumer, right after what is applied (by the sweep, say).
		cons, err := logread.New(ctx, w.r.js, natsx.ReadingsStream, natsx.ReadingsPartitionFilter(w.p), max(w.pos+1, w.r.cfg.FromSeq, 1))
		if err != nil {
			return nil, fmt.Errorf("READINGS of partition %d: %w", w.p, err)
		}
		w.cons = cons
		w.pending.Store(cons.Pending())
	}
	msgs, err := w.cons.Fetch(ctx, w.r.cfg.BatchSize, 0)
	if err == nil && len(msgs) == 0 {
		msgs, err = w.cons.Fetch(ctx, w.r.cfg.BatchSize, 200*time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch READINGS partition %d: %w", w.p, err)
	}
	return msgs, nil
}

// apply decides msgs with step, checks the events against EVENTS and writes the
// changed rows and the checkpoint in one transaction.
func (w *shadowWorker) apply(ctx context.Context, msgs []jetstream.Msg, inTx func(context.Context, func(pgx.Tx) error) error) error {
	sb, err := w.decide(msgs)
	if err != nil {
		return err
	}
	if err := w.checkEvents(ctx, sb.evs, sb.last); err != nil {
		return err
	}
	if err := w.write(ctx, sb, inTx); err != nil {
		return fmt.Errorf("partition %d batch up to seq %d: %w", w.p, sb.last, err)
	}
	crashpoint.Hit(CrashRebuildAfterBatch)
	if w.r.afterBatch != nil {
		w.r.afterBatch()
	}
	for id, row := range sb.changed {
		w.rows[id] = row
	}
	w.cp, w.pos = sb.last, sb.last
	w.done.Add(uint64(len(msgs)))
	if !w.sweeping {
		w.pending.Store(sb.pending)
	}
	return nil
}

// shadowBatch is what a batch of messages makes of the shadow's rows: the changed rows (in
// order of their first change), the events they derive, the batch's last sequence and the
// messages still pending after it.
type shadowBatch struct {
	changed       map[string]row
	order         []string
	evs           []event.Event
	last, pending uint64
}

// decide applies msgs, in order, to the partition's rows without writing them.
func (w *shadowWorker) decide(msgs []jetstream.Msg) (shadowBatch, error) {
	sb := shadowBatch{changed: map[string]row{}}
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return sb, fmt.Errorf("message metadata: %w", err)
		}
		sb.last, sb.pending = md.Sequence.Stream, md.NumPending
		l, err := prepareLog(m.Subject(), m.Data(), w.r.cfg.PartitionCount)
		if err != nil {
			continue // set aside by the live projector
		}
		cur, ok := sb.changed[l.SensorID]
		if !ok {
			cur, ok = w.rows[l.SensorID]
		} else {
			ok = true
		}
		var touched bool
		cur, touched, sb.evs = step(cur, ok, l, w.p, sb.last, sb.evs)
		if touched {
			if _, seen := sb.changed[l.SensorID]; !seen {
				sb.order = append(sb.order, l.SensorID)
			}
			sb.changed[l.SensorID] = cur
		}
	}
	return sb, nil
}

// checkEvents checks the re-derived events against EVENTS; mismatches are logged (the
// first five) and fail the batch up to seq last.
func (w *shadowWorker) checkEvents(ctx context.Context, evs []event.Event, last uint64) error {
	var bad []error
	for _, e := range evs {
		if err := w.check.check(ctx, e); err != nil {
			if errors.Is(err, ErrEventMismatch) {
				bad = append(bad, err)
				continue
			}
			return err
		}
	}
	if len(bad) > 0 {
		for i, err := range bad {
			if i < 5 {
				w.r.log.Error("re-derived event does not match", "partition", w.p, "err", err)
			}
		}
		return fmt.Errorf("partition %d, READINGS up to seq %d: %d events: %w", w.p, last, len(bad), bad[0])
	}
	return nil
}

// write writes the batch's changed rows and the shadow's checkpoint in one transaction.
func (w *shadowWorker) write(ctx context.Context, sb shadowBatch, inTx func(context.Context, func(pgx.Tx) error) error) error {
	// Rows in w.rows are in the shadow (committed): updated in place (HOT, as the live
	// projector does), the others inserted.
	var upd, ins columns
	for _, id := range sb.order {
		if _, ok := w.rows[id]; ok {
			upd.add(id, w.p, sb.changed[id])
		} else {
			ins.add(id, w.p, sb.changed[id])
		}
	}
	return inTx(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		queueRows(b, ShadowTable, &upd, &ins)
		b.Queue(`INSERT INTO checkpoints (projection, partition, seq, stream) VALUES ($1, $2, $3, $4)
			ON CONFLICT (projection, partition) DO UPDATE SET seq = excluded.seq, stream = excluded.stream, updated_at = now()`,
			ShadowName, w.p, int64(sb.last), w.r.pos.id)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write %s: %w", ShadowTable, err)
		}
		return nil
	})
}
