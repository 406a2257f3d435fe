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

// byTID restricts an UPDATE's target d to the rows of byID's ids and sensors ($1, $2): it
// finds their visible versions' ctids one index probe each (the LATERAL subquery cannot be
// flattened, so it stays a parameterized probe, pruned to the sensor's partition) and scans
// the target by TID. A join of the target with the ids is planned from the table's
// statistics: without any (a table filled faster than autovacuum analyzes it, such as a
// burst into a fresh table) or with ones from before a backlog, the planner hashed every
// pending row of every partition for each statement, so that claims and finishes grew with
// the backlog. A TID scan is chosen whatever the statistics say. A ctid names a row only
// within its partition, so the ids are checked too (ids are unique across partitions).
// A row updated by another transaction after the statement's snapshot is skipped, not
// followed to its newest version as other scans do (EvalPlanQual re-checks the TID list,
// which holds the old version's; seen on PostgreSQL 15.18): use it only where that is
// harmless (a claim: the row is claimed later) or where the rows are locked by an earlier
// statement of the transaction (finish, supersede).
const byTID = `d.ctid = ANY(ARRAY(SELECT x.ctid FROM ` + byID + `,
		LATERAL (SELECT t.ctid FROM notifier_deliveries t WHERE t.id = k.id AND t.sensor_id = k.sensor_id OFFSET 0) x))
	AND d.id = ANY($1::bigint[])`

// pendingTarget is "d is pending" for an UPDATE reached by byTID. The C collation (equality
// is the same in every deterministic collation) keeps the planner from proving the partial
// indexes' predicate (state = 'pending') from it: it would otherwise scan such an index,
// which its estimates without statistics call nearly empty, instead of the TID list, and
// read every pending row again.
const pendingTarget = `d.state COLLATE "C" = 'pending'`

// querier runs statements in a transaction: a pgx.Tx, or a pgtx transaction's connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// collectIDs runs q, which selects (id, sensor_id) of delivery rows, and returns them in id
// order, for byID.
func collectIDs(ctx context.Context, tx querier, q string, args ...any) ([]int64, []string, error) {
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
