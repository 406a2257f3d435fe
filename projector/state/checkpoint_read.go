package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The one reader of the checkpoints table: a checkpoint is the last READINGS sequence a
// projection (state, or a rebuild's shadow) applied to a partition, and the stream it names.

// selectCheckpoint reads one checkpoint; lockCheckpoint locks its row too.
const (
	selectCheckpoint = `SELECT seq, coalesce(stream, ''), coalesce(seen_seq, seq) FROM checkpoints WHERE projection = $1 AND partition = $2`
	lockCheckpoint   = selectCheckpoint + ` FOR UPDATE`
)

// checkpointRow is a checkpoint with the stream it names ("" when unknown).
type checkpointRow struct {
	seq    uint64
	stream string
	// seen is the sequence up to which every reading's liveness is in the rows (seen.go);
	// seq when nothing is deferred.
	seen uint64
}

type querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

type rowQuerier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// scanCheckpoint scans a row of selectCheckpoint.
func scanCheckpoint(r pgx.Row) (checkpointRow, error) {
	var seq, seen int64
	var cp checkpointRow
	if err := r.Scan(&seq, &cp.stream, &seen); err != nil {
		return checkpointRow{}, err
	}
	cp.seq, cp.seen = uint64(seq), uint64(seen)
	return cp, nil
}

// readCheckpoint returns projection's checkpoint of partition p; none is a zero checkpoint.
func readCheckpoint(ctx context.Context, q rowQuerier, projection string, p int) (checkpointRow, error) {
	cp, err := scanCheckpoint(q.QueryRow(ctx, selectCheckpoint, projection, p))
	if errors.Is(err, pgx.ErrNoRows) {
		return checkpointRow{}, nil
	}
	if err != nil {
		return checkpointRow{}, fmt.Errorf("read %s checkpoint of partition %d: %w", projection, p, err)
	}
	return cp, nil
}

// readCheckpoints returns projection's checkpoints by partition, locking their rows (in
// partition order) when lock is set.
func readCheckpoints(ctx context.Context, q querier, projection string, lock bool) (map[int]checkpointRow, error) {
	sql := `SELECT partition, seq, coalesce(stream, '') FROM checkpoints WHERE projection = $1 ORDER BY partition`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := q.Query(ctx, sql, projection)
	if err != nil {
		return nil, fmt.Errorf("read %s checkpoints: %w", projection, err)
	}
	defer rows.Close()
	out := map[int]checkpointRow{}
	for rows.Next() {
		var p int
		var seq int64
		var cp checkpointRow
		if err := rows.Scan(&p, &seq, &cp.stream); err != nil {
			return nil, fmt.Errorf("scan %s checkpoint: %w", projection, err)
		}
		cp.seq = uint64(seq)
		out[p] = cp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s checkpoints: %w", projection, err)
	}
	return out, nil
}
