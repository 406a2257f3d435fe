// Package staterev reads sensors' current revisions from the state projection. Readers of
// EVENTS use it to tell a forged event from a real one: the state projector writes an
// event's outbox row in the transaction that sets the sensor's revision, so no real event
// is ever ahead of the state.
package staterev

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// Querier is what Of needs of Postgres (a *pgxpool.Pool or a pgx.Tx is one).
type Querier interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Of returns the revision in sensor_state of each of ids that has a row (a sensor without
// one has had no event: revision 0). In a transaction, the rest of it keeps generic plans.
func Of(ctx context.Context, q Querier, ids []string) (map[string]int64, error) {
	b := &pgx.Batch{}
	b.Queue(pgtx.GenericPlans)
	// One index probe per key of the partitioned table: a LATERAL subquery kept apart from
	// the join (OFFSET 0) is run per key, each pruned to its partition; sensor_id = ANY($1)
	// would search every partition for every key.
	b.Queue(`SELECT s.sensor_id, s.revision FROM unnest($1::text[]) AS k(sensor_id),
		LATERAL (SELECT sensor_id, revision FROM sensor_state WHERE sensor_id = k.sensor_id OFFSET 0) s`, ids)
	br := q.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("read state revisions: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read state revisions: %w", err)
	}
	out := make(map[string]int64, len(ids))
	var id string
	var rev int64
	_, err = pgx.ForEachRow(rows, []any{&id, &rev}, func() error {
		out[id] = rev
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read state revisions: %w", err)
	}
	return out, br.Close()
}
