package notifier

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// byID is the FROM item of statements that reach delivery rows by id: the ids ($1, in id
// order) with their sensors ($2, the partition key), so that each row is one index probe of
// one partition. A LATERAL subquery on k is run per id in that order, so rows it locks are
// locked in id order (see finish).
const byID = `unnest($1::bigint[], $2::text[]) AS k(id, sensor_id)`

// collectIDs runs q, which selects (id, sensor_id) of delivery rows, and returns them in id
// order, for byID.
func collectIDs(ctx context.Context, tx pgx.Tx, q string, args ...any) ([]int64, []string, error) {
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("select deliveries: %w", err)
	}
	type key struct {
		id     int64
		sensor string
	}
	ks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (key, error) {
		var k key
		err := r.Scan(&k.id, &k.sensor)
		return k, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("select deliveries: %w", err)
	}
	slices.SortFunc(ks, func(a, b key) int { return cmp.Compare(a.id, b.id) })
	ids, sensors := make([]int64, len(ks)), make([]string, len(ks))
	for i, k := range ks {
		ids[i], sensors[i] = k.id, k.sensor
	}
	return ids, sensors, nil
}
