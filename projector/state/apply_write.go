package state

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The writes of a batch, queued in one pgx.Batch after stepAll: the rows, the outbox and
// the checkpoint, sent together at the commit.

// queueRows queues the writes of the rows step touched that had an event (all of them, and
// those pending, when b.flush), and returns how many are updates; the others are deferred
// (seen.go).
func (b *batch) queueRows(w *pgx.Batch) int {
	var upd, ins columns
	for _, id := range b.ids {
		switch {
		case !b.dirty[id]:
			continue
		case !b.changed[id] && !b.flush:
			b.deferred = append(b.deferred, id)
			continue
		case b.exists[id]:
			upd.add(id, b.p, b.rows[id])
		default:
			ins.add(id, b.p, b.rows[id])
		}
	}
	if b.flush {
		// Every pending row exists (a sensor's first reading is a change) and is cached.
		for id := range b.cache.pending {
			if !b.dirty[id] {
				upd.add(id, b.p, b.cache.rows[id])
			}
		}
	}
	b.s.m.rows.WithLabelValues("change").Add(float64(len(b.changed)))
	b.s.m.rows.WithLabelValues("seen").Add(float64(len(upd.id) + len(ins.id) - len(b.changed)))
	queueRows(w, "sensor_state", &upd, &ins)
	return len(upd.id)
}

// queueOutbox queues the outbox rows of the events step derived; the outbox id orders the
// relay, so rows are inserted in event order.
func (b *batch) queueOutbox(w *pgx.Batch) error {
	if len(b.evs) == 0 {
		return nil
	}
	eid := make([]string, len(b.evs))
	sid := make([]string, len(b.evs))
	rev := make([]int64, len(b.evs))
	payload := make([][]byte, len(b.evs))
	for i, e := range b.evs {
		raw, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		eid[i], sid[i], rev[i], payload[i] = e.ID, e.SensorID, e.Revision, raw
	}
	if b.traced {
		w.Queue(`INSERT INTO outbox (event_id, partition, sensor_id, revision, payload, traceparent)
			SELECT e, $2, s, r, b, nullif(tp, '') FROM unnest($1::text[], $3::text[], $4::bigint[], $5::bytea[], $6::text[]) WITH ORDINALITY AS t(e, s, r, b, tp, o)
			ORDER BY o`, eid, b.p, sid, rev, payload, b.evTP)
		return nil
	}
	w.Queue(`INSERT INTO outbox (event_id, partition, sensor_id, revision, payload)
		SELECT e, $2, s, r, b FROM unnest($1::text[], $3::text[], $4::bigint[], $5::bytea[]) WITH ORDINALITY AS t(e, s, r, b, o)
		ORDER BY o`, eid, b.p, sid, rev, payload)
	return nil
}

// queueCheckpoint queues the checkpoint's advance to lastSeq, naming the consumer's stream,
// and where the liveness in the rows is up to: unchanged while some is pending, from the
// batch on when only it defers some (everything up to the checkpoint it found is written),
// and NULL when nothing is pending.
func (b *batch) queueCheckpoint(w *pgx.Batch, lastSeq uint64) {
	w.Queue(`UPDATE checkpoints SET seq = $3, stream = coalesce(nullif($4, ''), stream),
			seen_seq = CASE WHEN $5::bool THEN coalesce(seen_seq, $6) END, updated_at = now()
		WHERE projection = $1 AND partition = $2`,
		Name, b.p, int64(lastSeq), b.cache.stream, b.pendingAfter(), int64(b.cp))
}

// send runs w in the transaction, and commits it too when commit is set; w's first
// statement is the UPDATE of the updated rows when there are any, and each of them must
// still be there.
func (b *batch) send(ctx context.Context, w *pgx.Batch, updated int, commit bool) error {
	read := func(br pgx.BatchResults) error {
		for i := range w.QueuedQueries {
			tag, err := br.Exec()
			if err != nil {
				if i == 0 && updated > 0 {
					return fmt.Errorf("update sensor_state: %w", err)
				}
				return fmt.Errorf("write sensor_state, outbox and checkpoint: %w", err)
			}
			if i == 0 && updated > 0 && tag.RowsAffected() != int64(updated) {
				return fmt.Errorf("update sensor_state: updated %d rows, want %d: rows vanished under the projector", tag.RowsAffected(), updated)
			}
		}
		return nil
	}
	if commit {
		return b.tx.Commit(ctx, w, read)
	}
	return b.tx.Send(ctx, w, read)
}
