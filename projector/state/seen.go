package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// Coalesced liveness. Most readings repeat their sensor's state: all they change in its row
// is the liveness (last_seen, last_reading_time, last_seq). A batch writes at once the rows
// whose state, connection or revision changed (every row that derived an event); a row
// whose only news is liveness is kept in the partition's cache, pending, and written with
// the others pending when the oldest of them has waited seenFlushAge(SeenInterval): by the
// batch that finds them due, or by a transaction of their own when the partition is idle
// (runPartition wakes up for it). So Postgres does work per change, and the liveness it
// shows is at most SeenInterval behind the readings the projector has applied.
//
// A batch whose readings change nothing but liveness, found so from the cached rows, opens
// no transaction at all (applyInMemory): its rows join the pending ones, and the checkpoint
// moves past it with the next transaction of the partition, a batch with an event or the
// write of the pending liveness, due within the same interval. Until then, a crash or a
// takeover reads these readings again from the checkpoint, and they change nothing again.
//
// The checkpoint advances with every transaction, in it, with its rows. What
// is pending is recorded beside it: checkpoints.seen_seq is the sequence up to which every
// reading's liveness is in the rows (NULL when nothing is pending). Whoever cannot trust its
// memory (a restart, a takeover, a failed transaction, another writer) loads the rows and
// replays the readings in (seen_seq, seq] from READINGS onto them with step (recoverSeen):
// each of them changed nothing but liveness the first time, so step derives no event and the
// rows come out exactly as the lost memory held them, before anything new is applied.
//
// A rebuild writes every row it touches, so its swap leaves nothing pending; a rebase starts
// the checkpoints on another stream, whose readings cannot restore the old one's pending
// liveness (it stays at most SeenInterval old).

// SeenIntervalMax bounds SeenInterval: pending liveness is replayed from READINGS after a
// restart, and a longer interval makes that replay longer.
const SeenIntervalMax = time.Minute

// errSeenReplay is a replay of deferred liveness that derived an event: the rows or the
// checkpoints were changed by something else than the projector.
var errSeenReplay = errors.New("replaying deferred liveness derived an event: sensor_state does not match its checkpoint")

// seenFlushAge is how long the oldest pending liveness waits before it is written: half the
// interval, so that the batch or the idle wake-up that writes it, and its commit, fit in the
// interval the API states even on a busy machine (a batch decides at its start, and a
// reading applied in memory counts as applied from then on).
func seenFlushAge(interval time.Duration) time.Duration { return interval / 2 }

// seenDue says whether the pending liveness is to be written at now.
func (c *rowCache) seenDue(now time.Time, interval time.Duration) bool {
	return len(c.pending) > 0 && now.Sub(c.pendingSince) >= seenFlushAge(interval)
}

// seenWait is how long an idle partition may wait for a message before its pending
// liveness is due: at most idle, and at least seenWaitMin.
func (c *rowCache) seenWait(now time.Time, interval, idle time.Duration) time.Duration {
	if len(c.pending) == 0 {
		return idle
	}
	return min(idle, max(c.pendingSince.Add(seenFlushAge(interval)).Sub(now), seenWaitMin))
}

// seenWaitMin is the shortest wait for a message: the write of due liveness may come that
// much later, well within the half interval it has. A wait of a few milliseconds, as the due
// time neared, ended pulls just as a message arrived at a busy partition, which then lost
// it to the expired pull and read again from the checkpoint.
const seenWaitMin = 100 * time.Millisecond

// committed records in the cache what b committed at now: its rows, and which rows' liveness
// is pending after it.
func (c *rowCache) committed(b *batch, now time.Time) {
	for id, r := range b.rows {
		c.rows[id] = r
	}
	if b.flush {
		clear(c.pending)
	} else {
		for id := range b.changed {
			delete(c.pending, id)
		}
	}
	for _, id := range b.deferred {
		if len(c.pending) == 0 {
			c.pendingSince = now
		}
		c.pending[id] = struct{}{}
	}
}

// applyInMemory applies the batch items (all msgs of it, up to lastSeq) to partition p's
// cached rows without a transaction, when it can: the pending liveness is not due, every
// sensor's row is cached and follows on from what memory applied, and no reading derives an
// event. Its rows are then pending; it returns nil when the batch needs a transaction.
func (s *Projector) applyInMemory(p int, items []item, msgs int, lastSeq uint64, cache *rowCache) *batch {
	now := s.clock.Now()
	if s.cfg.SeenInterval == 0 || cache.stale || len(items) == 0 || len(items) < msgs ||
		items[0].seq <= max(cache.cp, cache.applied) || cache.seenDue(now, s.cfg.SeenInterval) {
		return nil
	}
	b := &batch{s: s, p: p, cache: cache, inMemory: true, rows: make(map[string]row, len(items))}
	var evs []event.Event
	for _, it := range items {
		id := it.log.SensorID
		cur, ok := b.rows[id]
		if !ok {
			if cur, ok = cache.rows[id]; !ok {
				return nil // a row to load, or a sensor's first reading
			}
		}
		next, touched, more := step(cur, true, it.log, p, it.seq, evs)
		if len(more) > 0 {
			return nil
		}
		if touched {
			b.rows[id] = next
		}
		b.applied++
	}
	if len(b.rows) == 0 {
		return nil // nothing pending would bring the checkpoint past these
	}
	for id, r := range b.rows {
		if len(cache.pending) == 0 {
			cache.pendingSince = now
		}
		cache.rows[id], cache.pending[id] = r, struct{}{}
	}
	cache.applied = lastSeq
	return b
}

// count returns how many of items b applied for the first time in this process (counted
// in locks_state_applied_total), and records them counted.
func (c *rowCache) count(items []item, b *batch) int {
	from := max(c.counted, b.cp) // b.cp: those at or below it were skipped
	n := 0
	for _, it := range items {
		if it.seq > from {
			n++
		}
	}
	if len(items) > 0 && !b.behind {
		c.counted = max(c.counted, items[len(items)-1].seq)
	}
	return n
}

// pendingAfter says whether liveness is pending once b commits.
func (b *batch) pendingAfter() bool {
	if len(b.deferred) > 0 {
		return true
	}
	if b.flush {
		return false
	}
	for id := range b.cache.pending {
		if !b.changed[id] {
			return true
		}
	}
	return false
}

// recoverSeen replays onto sensor_state the liveness of the readings in (b.seen, b.cp],
// which were applied and checkpointed while their rows waited in the memory of a process
// that is gone (or forgot them), and marks nothing pending.
func (b *batch) recoverSeen(ctx context.Context) error {
	items, err := b.s.readRange(ctx, b.p, b.seen, b.cp)
	if err != nil {
		return err
	}
	var ids []string
	seen := map[string]bool{}
	for _, it := range items {
		if !seen[it.log.SensorID] {
			seen[it.log.SensorID] = true
			ids = append(ids, it.log.SensorID)
		}
	}
	rows := make(map[string]row, len(ids))
	if len(ids) > 0 {
		q, err := b.tx.Conn().Query(ctx, selectRows, ids)
		if err == nil {
			err = scanRows(q, rows)
		}
		if err != nil {
			return fmt.Errorf("replay deferred liveness: %w", err)
		}
	}
	touched := map[string]bool{}
	for _, it := range items {
		cur, ok := rows[it.log.SensorID]
		if ok && it.seq <= cur.lastSeq {
			continue // in the row already
		}
		next, t, evs := step(cur, ok, it.log, b.p, it.seq, nil)
		if len(evs) > 0 {
			return fmt.Errorf("partition %d, sensor %s, READINGS seq %d: %w", b.p, it.log.SensorID, it.seq, errSeenReplay)
		}
		if t {
			rows[it.log.SensorID], touched[it.log.SensorID] = next, true
		}
	}
	var upd, none columns
	for _, id := range ids {
		if touched[id] {
			upd.add(id, b.p, rows[id])
		}
	}
	w := &pgx.Batch{}
	queueRows(w, "sensor_state", &upd, &none)
	w.Queue(`UPDATE checkpoints SET seen_seq = NULL WHERE projection = $1 AND partition = $2`, Name, b.p)
	if err := b.send(ctx, w, len(upd.id), false); err != nil {
		return fmt.Errorf("replay deferred liveness: %w", err)
	}
	b.s.m.seenReplayed.Add(float64(len(upd.id)))
	b.s.log.Info("deferred liveness replayed from READINGS", "partition", b.p, "from_seq", b.seen+1, "to_seq", b.cp,
		"messages", len(items), "rows", len(upd.id))
	b.seen = b.cp
	return nil
}

// readRange reads partition p's READINGS messages in (after, upTo], decoded as step expects
// them; those that can never be applied are left out, as the batches left them out.
func (s *Projector) readRange(ctx context.Context, p int, after, upTo uint64) ([]item, error) {
	oc, err := s.js.OrderedConsumer(ctx, natsx.ReadingsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{natsx.ReadingsPartitionFilter(p)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("read READINGS %d-%d of partition %d: %w", after+1, upTo, p, err)
	}
	var out []item
	for {
		batch, err := oc.Fetch(s.cfg.BatchSize, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("read READINGS %d-%d of partition %d: %w", after+1, upTo, p, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("message metadata: %w", err)
			}
			if md.Sequence.Stream > upTo {
				return out, nil
			}
			if l, err := prepareLog(m.Subject(), m.Data(), s.cfg.PartitionCount); err == nil {
				out = append(out, item{seq: md.Sequence.Stream, log: l})
			}
			if md.Sequence.Stream == upTo || md.NumPending == 0 {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("read READINGS %d-%d of partition %d: %w", after+1, upTo, p, err)
		}
		if n == 0 {
			// Nothing more in the stream (retention took them, or the partition ends
			// before upTo): what was deferred of the missing ones stays as it was written.
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}
