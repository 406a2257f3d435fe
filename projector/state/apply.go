package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/nats-io/nats.go/jetstream"
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
		out = append(out, item{seq: md.Sequence.Stream, log: l})
	}
	return out, nil
}

// applyBatch applies msgs of partition p in one transaction: lock the checkpoint, skip what
// is at or below it, update sensor_state, write the outbox, advance the checkpoint. cache
// may be nil.
func (s *Projector) applyBatch(ctx context.Context, p int, msgs []jetstream.Msg, cache *rowCache) error {
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
	if len(cache.rows) > cache.max {
		cache.clear()
	}
	var ids, missing []string
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if !seen[it.log.SensorID] {
			seen[it.log.SensorID] = true
			ids = append(ids, it.log.SensorID)
			if _, ok := cache.rows[it.log.SensorID]; !ok {
				missing = append(missing, it.log.SensorID)
			}
		}
	}
	start := time.Now()
	var applied, skipped int
	var evs []event.Event
	var state map[string]row
	err = pgx.BeginFunc(ctx, s.pg, func(tx pgx.Tx) error {
		applied, skipped, evs = 0, 0, evs[:0]
		state = make(map[string]row, len(ids))
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO checkpoints (projection, partition, seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING`, Name, p)
		b.Queue(`SELECT seq, coalesce(stream, '') FROM checkpoints WHERE projection = $1 AND partition = $2 FOR UPDATE`, Name, p)
		// After the checkpoint lock, which a rebuild's swap holds while renaming the tables;
		// read from the catalog (not a regclass constant) so that no cached plan keeps it.
		b.Queue(`SELECT oid FROM pg_class WHERE relname = 'sensor_state' AND relnamespace = current_schema()::regnamespace`)
		b.Queue(selectRows, missing)
		br := tx.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return fmt.Errorf("insert checkpoint: %w", err)
		}
		var cp64 int64
		var cpStream string
		if err := br.QueryRow().Scan(&cp64, &cpStream); err != nil {
			br.Close()
			return fmt.Errorf("lock checkpoint: %w", err)
		}
		cp := uint64(cp64)
		if cp > 0 && cpStream != "" && cache.stream != "" && cpStream != cache.stream {
			// Rebased or written by a process on another stream since this consumer was
			// created: deciding by this sequence would skip or repeat readings.
			br.Close()
			return &CheckpointMismatchError{Projection: Name, Partition: p, Seq: cp, Stream: cpStream, Current: cache.stream}
		}
		var table uint32
		if err := br.QueryRow().Scan(&table); err != nil {
			br.Close()
			return fmt.Errorf("look up sensor_state: %w", err)
		}
		if table != cache.table {
			cache.clear()
			cache.table = table
		}
		rows, err := br.Query()
		if err == nil {
			err = scanRows(rows, state)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("load sensor_state: %w", err)
		}
		if cp == cache.cp {
			for _, id := range ids {
				if r, ok := cache.rows[id]; ok {
					state[id] = r
				}
			}
		} else {
			// Not the checkpoint this process left: its cached rows may be stale.
			cache.clear()
			if len(missing) < len(ids) {
				rows, err := tx.Query(ctx, selectRows, ids)
				if err == nil {
					err = scanRows(rows, state)
				}
				if err != nil {
					return fmt.Errorf("reload sensor_state: %w", err)
				}
			}
		}
		// Loaded rows are known to exist: new sensors are inserted, known ones updated.
		exists := make(map[string]bool, len(state))
		for id := range state {
			exists[id] = true
		}
		if lastSeq <= cp {
			skipped = len(msgs)
			return nil
		}

		dirty := make(map[string]bool, len(ids))
		for _, it := range items {
			if it.seq <= cp {
				skipped++
				continue
			}
			applied++
			cur, ok := state[it.log.SensorID]
			var touched bool
			cur, touched, evs = step(cur, ok, it.log, p, it.seq, evs)
			if touched {
				state[it.log.SensorID] = cur
				dirty[it.log.SensorID] = true
			}
		}

		w := &pgx.Batch{}
		var upd, ins columns
		for _, id := range ids {
			if !dirty[id] {
				continue
			}
			if exists[id] {
				upd.add(id, p, state[id])
			} else {
				ins.add(id, p, state[id])
			}
		}
		queueRows(w, "sensor_state", &upd, &ins)
		if len(evs) > 0 {
			eid := make([]string, len(evs))
			sid := make([]string, len(evs))
			rev := make([]int64, len(evs))
			payload := make([][]byte, len(evs))
			for i, e := range evs {
				b, err := json.Marshal(e)
				if err != nil {
					return fmt.Errorf("encode event: %w", err)
				}
				eid[i], sid[i], rev[i], payload[i] = e.ID, e.SensorID, e.Revision, b
			}
			// The outbox id orders the relay: rows are inserted in event order.
			w.Queue(`INSERT INTO outbox (event_id, partition, sensor_id, revision, payload)
				SELECT e, $2, s, r, b FROM unnest($1::text[], $3::text[], $4::bigint[], $5::bytea[]) WITH ORDINALITY AS t(e, s, r, b, o)
				ORDER BY o`, eid, p, sid, rev, payload)
		}
		w.Queue(`UPDATE checkpoints SET seq = $3, stream = coalesce(nullif($4, ''), stream), updated_at = now() WHERE projection = $1 AND partition = $2`,
			Name, p, int64(lastSeq), cache.stream)
		br = tx.SendBatch(ctx, w)
		if len(upd.id) > 0 {
			tag, err := br.Exec()
			if err == nil && tag.RowsAffected() != int64(len(upd.id)) {
				err = fmt.Errorf("updated %d sensor_state rows, want %d: rows vanished under the projector", tag.RowsAffected(), len(upd.id))
			}
			if err != nil {
				br.Close()
				return fmt.Errorf("update sensor_state: %w", err)
			}
		}
		if err := br.Close(); err != nil {
			return fmt.Errorf("write sensor_state, outbox and checkpoint: %w", err)
		}
		return nil
	})
	if err != nil {
		cache.clear()
		return fmt.Errorf("partition %d batch up to seq %d: %w", p, lastSeq, err)
	}
	for id, r := range state {
		cache.rows[id] = r
	}
	cache.cp = max(lastSeq, cache.cp)
	if skipped == len(msgs) {
		// Nothing written: the checkpoint stayed where it was, beyond lastSeq.
		cache.clear()
	}
	s.m.commit.Observe(time.Since(start).Seconds())
	s.m.batch.Observe(float64(len(msgs)))
	s.m.applied.Add(float64(applied))
	if skipped > 0 {
		s.m.skipped.WithLabelValues("already_applied").Add(float64(skipped))
	}
	for _, e := range evs {
		s.m.events.WithLabelValues(e.Type).Inc()
	}
	return nil
}

// checkpoint returns partition p's checkpoint and the stream it names ("" when unknown).
func (s *Projector) checkpoint(ctx context.Context, p int) (uint64, string, error) {
	var seq int64
	var stream string
	err := s.pg.QueryRow(ctx, `SELECT seq, coalesce(stream, '') FROM checkpoints WHERE projection = $1 AND partition = $2`,
		Name, p).Scan(&seq, &stream)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read checkpoint of partition %d: %w", p, err)
	}
	return uint64(seq), stream, nil
}
