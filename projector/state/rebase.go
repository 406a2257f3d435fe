package state

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// RebaseResult says what Rebase did.
type RebaseResult struct {
	// Partitions whose checkpoints were restarted; none when every checkpoint belonged to
	// READINGS already.
	Partitions []int
	// From is the first READINGS sequence the state projector applies to them.
	From uint64
	// Stream is the identity of READINGS the checkpoints now name.
	Stream string
	// ShadowDropped: the shadow of an unfinished rebuild followed the old checkpoints and
	// was dropped.
	ShadowDropped bool
}

// Rebase is the way out of a checkpoint mismatch (see checkpoint.go) that keeps what
// Postgres knows: the state projection's checkpoints that do not belong to READINGS are
// restarted just before fromSeq (0: the stream's first sequence) and name the current
// stream, so the running state projector applies every reading from there on top of the
// kept sensor_state. Revisions go on from the kept ones, so the events it derives get new
// ids and are published once.
//
// A checkpoint merely ahead of the same stream (a store restored from an older copy, or one
// that lost its last writes) needs fromSeq: the stream's start holds readings the projection
// has applied already, and only the operator knows where the new ones begin.
//
// A rebuild's shadow (which followed the old checkpoints) is dropped with it; a rebuild
// running meanwhile fails and can be started again. Liveness the projector had deferred on
// the old stream (seen.go) cannot be replayed from the new one: it stays as last written, at
// most LOCKS_STATE_SEEN_INTERVAL old.
func Rebase(ctx context.Context, js jetstream.JetStream, pg *pgxpool.Pool, fromSeq uint64, log *slog.Logger) (RebaseResult, error) {
	pos, err := readingsPosition(ctx, js)
	if err != nil {
		return RebaseResult{}, err
	}
	res := RebaseResult{From: max(fromSeq, pos.firstSeq, 1), Stream: pos.id}
	if res.From > pos.lastSeq+1 {
		return RebaseResult{}, fmt.Errorf("rebase: sequence %d is beyond READINGS' last sequence %d", res.From, pos.lastSeq)
	}
	err = pgx.BeginFunc(ctx, pg, func(tx pgx.Tx) error {
		res.Partitions, res.ShadowDropped = nil, false
		// The lock of prepareShadow: no rebuild creates a shadow meanwhile.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('locks.rebuild.state'))`); err != nil {
			return fmt.Errorf("rebuild lock: %w", err)
		}
		bad, err := mismatchedCheckpoints(ctx, tx, js, Name, pos, true)
		if err != nil || len(bad) == 0 {
			return err
		}
		for _, e := range bad {
			if !e.OtherStream() && fromSeq == 0 {
				return fmt.Errorf("rebase: %w; READINGS still holds the readings applied before, so say where the new ones start: --from-seq or --from-time", e)
			}
		}
		for _, e := range bad {
			if _, err := tx.Exec(ctx, `UPDATE checkpoints SET seq = $3, stream = $4, seen_seq = NULL, updated_at = now() WHERE projection = $1 AND partition = $2`,
				Name, e.Partition, int64(res.From-1), pos.id); err != nil {
				return fmt.Errorf("rebase checkpoint of partition %d: %w", e.Partition, err)
			}
			res.Partitions = append(res.Partitions, e.Partition)
		}
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, ShadowTable).Scan(&res.ShadowDropped); err != nil {
			return fmt.Errorf("look up %s: %w", ShadowTable, err)
		}
		for _, q := range []string{`DROP TABLE IF EXISTS ` + ShadowTable,
			`DELETE FROM checkpoints WHERE projection = '` + ShadowName + `'`} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("drop the rebuild's shadow: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return RebaseResult{}, err
	}
	if len(res.Partitions) == 0 {
		log.Info("every state checkpoint belongs to READINGS: nothing to rebase", "stream", pos.id)
		return res, nil
	}
	log.Warn("state checkpoints rebased onto the current READINGS stream: the state projector applies it from there on top of the kept state",
		"partitions", res.Partitions, "from_seq", res.From, "stream", pos.id, "shadow_dropped", res.ShadowDropped)
	return res, nil
}
