package state

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/pgtx"
	"github.com/lock-sensors/lock-sensors/internal/tracing"
)

// decodeBatch parses and checks msgs. A message that can never be applied (forged or
// malformed: see event.CheckLog) is set aside before the batch commits past it, so that it
// stops nothing else; an error here is transient (NATS unreachable for the record) and the
// batch is retried.
func (s *Projector) decodeBatch(ctx context.Context, p int, msgs []jetstream.Msg) ([]item, error) {
	out := make([]item, 0, len(msgs))
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("message metadata: %w", err)
		}
		l, err := prepareLog(m.Subject(), m.Data(), s.cfg.PartitionCount)
		if err != nil {
			if err := s.setAside.SetAside(ctx, natsx.ReadingsStream, md.Sequence.Stream, m.Subject(), m.Data(), err); err != nil {
				return nil, err
			}
			s.m.skipped.WithLabelValues("invalid").Inc()
			continue
		}
		it := item{seq: md.Sequence.Stream, log: l}
		if s.tracer != nil {
			it.tp = m.Headers().Get(tracing.Traceparent)
		}
		out = append(out, it)
	}
	return out, nil
}

// batch is one batch of a partition inside its transaction: what the steps of applyBatch
// read and write.
type batch struct {
	s     *Projector
	tx    *pgtx.Tx
	p     int
	epoch int64 // the fence: the transaction rolls back unless it is still p's epoch
	cache *rowCache
	// ids are the batch's sensors in first-seen order; missing those not in the cache.
	ids, missing []string
	cp           uint64          // the checkpoint, locked
	seen         uint64          // up to where liveness is in the rows (seen.go)
	rows         map[string]row  // the batch's sensors' rows, as loaded and then stepped
	exists       map[string]bool // rows loaded: updated in place; the others are inserted
	dirty        map[string]bool // rows step wrote
	changed      map[string]bool // rows of sensors that had an event: written at once
	// flush: every row step touched is written, and every pending one (seen.go); deferred
	// are the rows whose liveness this batch leaves pending instead.
	flush    bool
	deferred []string
	evs      []event.Event
	// evTP are the traceparents of evs' readings, only while tracing (traced).
	evTP []string
	// evSpans are the spans of evs, only while tracing (startEvents).
	evSpans []trace.Span
	traced  bool
	applied int
	skipped int
	behind  bool // the whole batch was at or below the checkpoint
	// inMemory: the batch changed nothing but liveness and was not committed (applyInMemory).
	inMemory bool
}

func newBatch(s *Projector, tx *pgtx.Tx, p int, epoch int64, items []item, cache *rowCache) *batch {
	b := &batch{s: s, tx: tx, p: p, epoch: epoch, cache: cache}
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if !seen[it.log.SensorID] {
			seen[it.log.SensorID] = true
			b.ids = append(b.ids, it.log.SensorID)
			if _, ok := cache.rows[it.log.SensorID]; !ok {
				b.missing = append(b.missing, it.log.SensorID)
			}
		}
	}
	return b
}

// applyBatch applies msgs of partition p in one transaction, in named steps: check the
// owner's epoch, lock the checkpoint and load the rows (one round trip), skip what is at or
// below the checkpoint, step the rest, then write the rows, the outbox and the advanced
// checkpoint (one more). It fails with lease.ErrFenced, writing nothing, when epoch is no
// longer p's. cache may be nil.
func (s *Projector) applyBatch(ctx context.Context, p int, epoch int64, msgs []jetstream.Msg, cache *rowCache) (err error) {
	var b *batch
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.startApply(ctx, p, msgs)
		defer func() {
			if b == nil {
				b = &batch{}
			}
			b.endEvents(err)
			endApply(span, b.applied, b.skipped, len(b.evs), err)
		}()
	}
	items, err := s.decodeBatch(ctx, p, msgs)
	if err != nil {
		return err
	}
	md, err := msgs[len(msgs)-1].Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	lastSeq := md.Sequence.Stream
	if cache == nil {
		cache = newRowCache(0)
	}
	if b = s.applyInMemory(p, items, len(msgs), lastSeq, cache); b == nil {
		b, err = s.commit(ctx, p, epoch, items, lastSeq, cache, false)
		if err != nil {
			return fmt.Errorf("partition %d batch up to seq %d: %w", p, lastSeq, err)
		}
	}
	switch {
	case b.inMemory:
		s.m.inMemory.Add(float64(len(items)))
	case b.behind:
		// Nothing written: the checkpoint stayed where it was, beyond lastSeq.
		cache.clear()
	default:
		committed := time.Now()
		for _, it := range items {
			s.m.stage.Between(it.log.ReceivedTime, committed)
		}
	}
	if !b.inMemory {
		s.m.batch.Observe(float64(len(msgs)))
	}
	if !b.behind {
		s.m.appliedSeq.WithLabelValues(strconv.Itoa(p)).Set(float64(lastSeq))
	}
	s.m.applied.Add(float64(cache.count(items, b)))
	if b.skipped > 0 {
		s.m.skipped.WithLabelValues("already_applied").Add(float64(b.skipped))
	}
	for _, e := range b.evs {
		s.m.events.WithLabelValues(e.Type).Inc()
	}
	if len(b.evs) > 0 && s.relay != nil {
		s.nudge(p) // its outbox rows are committed
	}
	return nil
}

// commit applies items (the decoded messages up to lastSeq) to partition p in one
// transaction, and records in cache what it committed. With no items (lastSeq 0) it writes
// the pending liveness only (flushSeen). flush writes every pending row, due or not.
func (s *Projector) commit(ctx context.Context, p int, epoch int64, items []item, lastSeq uint64, cache *rowCache, flush bool) (*batch, error) {
	now := s.clock.Now()
	// A full cache is emptied, after its pending liveness is written.
	full := len(cache.rows) > cache.max
	if full && len(cache.pending) == 0 {
		cache.clear()
		full = false
	}
	if cache.ahead() && len(items) > 0 && items[0].seq <= cache.applied {
		// Delivered again (the reader resumed from the checkpoint): what memory applied
		// beyond the checkpoint is applied again from Postgres's rows.
		cache.clear()
	}
	var b *batch
	// BEGIN goes with the first batch (lockAndLoad) and COMMIT with the last (send).
	err := pgtx.Run(ctx, s.pg, func(tx *pgtx.Tx) error {
		b = newBatch(s, tx, p, epoch, items, cache)
		b.traced = s.tracer != nil
		b.flush = flush || s.cfg.SeenInterval == 0 || full || cache.seenDue(now, s.cfg.SeenInterval)
		if err := b.lockAndLoad(ctx); err != nil {
			return err
		}
		if lastSeq == 0 {
			// Nothing to apply: the checkpoint stays, or moves to what memory applied.
			lastSeq = max(b.cp, cache.applied)
		} else if lastSeq <= b.cp {
			b.skipped, b.behind = len(items), true
			return tx.Commit(ctx, nil, nil)
		}
		b.stepAll(items)
		if b.traced {
			b.startEvents(ctx, s.tracer)
		}
		w := &pgx.Batch{}
		updated := b.queueRows(w)
		if err := b.queueOutbox(w); err != nil {
			return err
		}
		b.queueCheckpoint(w, lastSeq)
		return b.send(ctx, w, updated, true)
	})
	if err != nil {
		cache.clear()
		return b, err
	}
	cache.committed(b, s.clock.Now())
	cache.cp, cache.stale = max(lastSeq, cache.cp), false
	cache.applied = max(cache.applied, cache.cp)
	if full {
		cache.clear()
	}
	s.m.commit.Observe(time.Since(now).Seconds())
	return b, nil
}

// flushSeen writes partition p's pending liveness in a transaction of its own (when the
// partition is idle and it is due, or stops), after replaying what a lost memory deferred.
func (s *Projector) flushSeen(ctx context.Context, p int, epoch int64, cache *rowCache) error {
	if _, err := s.commit(ctx, p, epoch, nil, 0, cache, true); err != nil {
		return fmt.Errorf("partition %d: write pending liveness: %w", p, err)
	}
	return nil
}

// lockAndLoad locks the partition's checkpoint (creating its row), checks that it belongs to
// the consumer's stream, and loads the rows of the batch's sensors: from the cache when the
// checkpoint is the one this process left, from sensor_state otherwise.
func (b *batch) lockAndLoad(ctx context.Context) error {
	q := &pgx.Batch{}
	// The batch's reads and writes join its sensors to the partitioned sensor_state.
	q.Queue(keyedJoins)
	q.Queue(pgtx.GenericPlans)
	// Then the fence, so that a claim by another process waits for this transaction or fences it.
	lease.QueueCheck(q, Name, b.p)
	q.Queue(`INSERT INTO checkpoints (projection, partition, seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING`, Name, b.p)
	q.Queue(lockCheckpoint, Name, b.p)
	// After the checkpoint lock, which a rebuild's swap holds while renaming the tables;
	// read from the catalog (not a regclass constant) so that no cached plan keeps it.
	q.Queue(`SELECT oid FROM pg_class WHERE relname = 'sensor_state' AND relnamespace = current_schema()::regnamespace`)
	q.Queue(selectRows, b.missing)
	err := b.tx.Send(ctx, q, func(br pgx.BatchResults) error {
		for range 2 { // keyedJoins, pgtx.GenericPlans
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := lease.ReadCheck(br, Name, b.p, b.epoch); err != nil {
			return err
		}
		if err := b.lockCheckpoint(br); err != nil {
			return err
		}
		b.rows = make(map[string]row, len(b.ids))
		rows, err := br.Query()
		if err == nil {
			err = scanRows(rows, b.rows)
		}
		if err != nil {
			return fmt.Errorf("load sensor_state: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return b.loadRows(ctx)
}

// lockCheckpoint reads the locked checkpoint and sensor_state's identity from br.
func (b *batch) lockCheckpoint(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("insert checkpoint: %w", err)
	}
	cp, err := scanCheckpoint(br.QueryRow())
	if err != nil {
		return fmt.Errorf("lock checkpoint: %w", err)
	}
	b.cp, b.seen = cp.seq, cp.seen
	if cp.seq > 0 && cp.stream != "" && b.cache.stream != "" && cp.stream != b.cache.stream {
		// Rebased or written by a process on another stream since this consumer was
		// created: deciding by this sequence would skip or repeat readings.
		return &CheckpointMismatchError{Projection: Name, Partition: b.p, Seq: cp.seq, Stream: cp.stream, Current: b.cache.stream}
	}
	var table uint32
	if err := br.QueryRow().Scan(&table); err != nil {
		return fmt.Errorf("look up sensor_state: %w", err)
	}
	if table != b.cache.table {
		if err := b.cache.forget(); err != nil {
			return err
		}
		b.cache.table = table
	}
	return nil
}

// loadRows completes b.rows (the missing ones are loaded) from the cache, or, when the
// checkpoint is not the one this process left (its cached rows may be stale), from
// sensor_state.
func (b *batch) loadRows(ctx context.Context) error {
	if b.cp == b.cache.cp {
		for _, id := range b.ids {
			if r, ok := b.cache.rows[id]; ok {
				b.rows[id] = r
			}
		}
	} else {
		if err := b.cache.forget(); err != nil {
			return err
		}
		if b.seen < b.cp {
			// Liveness deferred by a memory that is gone: replayed first, and every row
			// read again after it.
			if err := b.recoverSeen(ctx); err != nil {
				return err
			}
			clear(b.rows)
			b.missing = nil
		}
		if len(b.missing) < len(b.ids) {
			rows, err := b.tx.Conn().Query(ctx, selectRows, b.ids)
			if err == nil {
				err = scanRows(rows, b.rows)
			}
			if err != nil {
				return fmt.Errorf("reload sensor_state: %w", err)
			}
		}
	}
	b.exists = make(map[string]bool, len(b.rows))
	for id := range b.rows {
		b.exists[id] = true
	}
	return nil
}

// stepAll applies the items above the checkpoint to the rows, in order.
func (b *batch) stepAll(items []item) {
	b.dirty = make(map[string]bool, len(b.ids))
	b.changed = make(map[string]bool)
	for _, it := range items {
		if it.seq <= b.cp {
			b.skipped++
			continue
		}
		b.applied++
		cur, ok := b.rows[it.log.SensorID]
		var touched bool
		n := len(b.evs)
		cur, touched, b.evs = step(cur, ok, it.log, b.p, it.seq, b.evs)
		if b.traced {
			for range len(b.evs) - n {
				b.evTP = append(b.evTP, it.tp)
			}
		}
		if touched {
			b.rows[it.log.SensorID] = cur
			b.dirty[it.log.SensorID] = true
			if len(b.evs) > n {
				b.changed[it.log.SensorID] = true
			}
		}
	}
}
