package state

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// swap applies the tail and renames the tables in one transaction, holding the live
// checkpoints (in partition order, as the projector takes them one at a time: no deadlock)
// and sensor_state against writes.
func (r *Rebuild) swap(ctx context.Context, workers []*shadowWorker) (string, error) {
	old := OldTablePrefix + rebuild.OldSuffix(time.Now())
	// What the workers counted before the tail, which a failed swap rolls back.
	type counts struct {
		done                uint64
		checked, unverified int
	}
	before := make([]counts, len(workers))
	for i, w := range workers {
		before[i] = counts{w.done.Load(), w.check.checked, w.check.unverified}
	}
	err := pgx.BeginFunc(ctx, r.pg, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = `+strconv.FormatInt(r.cfg.LockTimeout.Milliseconds(), 10)); err != nil {
			return fmt.Errorf("lock timeout: %w", err)
		}
		// Every partition's checkpoint row exists before the rows are locked: a live batch of
		// a partition without one would otherwise not wait for the swap, read the old table,
		// and then write into it after the rename. Uncommitted, these rows hold such a batch
		// at its own insert of the row.
		if _, err := tx.Exec(ctx, `INSERT INTO checkpoints (projection, partition, seq)
			SELECT $1, g, 0 FROM generate_series(0, $2::int - 1) AS g ON CONFLICT DO NOTHING`, Name, r.cfg.PartitionCount); err != nil {
			return fmt.Errorf("live checkpoint rows: %w", err)
		}
		live, err := readCheckpoints(ctx, tx, Name, true)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE sensor_state IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("lock sensor_state: %w", err)
		}
		inTx := func(_ context.Context, f func(pgx.Tx) error) error { return f(tx) }
		for _, w := range workers {
			w.check.pg = tx
			err := w.applyUpTo(ctx, live[w.p].seq, inTx)
			w.check.pg = r.pg
			if err != nil {
				return fmt.Errorf("tail of partition %d: %w", w.p, err)
			}
		}
		if r.renumbered {
			if err := continueRevisions(ctx, tx); err != nil {
				return err
			}
		}
		renames, err := indexRenames(ctx, tx, "sensor_state", ShadowTable, old)
		if err != nil {
			return err
		}
		parts, err := partitionRenames(ctx, tx, old)
		if err != nil {
			return err
		}
		stmts := append(append(renames, parts...),
			`ALTER TABLE sensor_state RENAME TO `+old,
			`ALTER TABLE `+ShadowTable+` RENAME TO sensor_state`,
			`DELETE FROM checkpoints WHERE projection = '`+ShadowName+`'`,
			// The shadow wrote the liveness of every reading up to the live checkpoints: none
			// is pending in the table swapped in (the live projector forgets its own when it
			// sees the table change).
			`UPDATE checkpoints SET seen_seq = NULL WHERE projection = '`+Name+`'`)
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("swap (%s): %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		for i, w := range workers {
			w.done.Store(before[i].done)
			w.check.checked, w.check.unverified = before[i].checked, before[i].unverified
		}
		// The shadow's rows in memory may be ahead of the rolled-back tail: a new Run
		// continues from the committed shadow.
		return "", fmt.Errorf("swap the rebuilt state projection in (run the rebuild again to continue): %w", err)
	}
	return old, nil
}

// indexRenames gives the indexes of live (sensor_state or one of its partitions) names of
// the old table, and those of its twin in the shadow (named by LIKE) the live names,
// matching them by definition.
func indexRenames(ctx context.Context, tx pgx.Tx, live, shadow, old string) ([]string, error) {
	list := func(table string) (map[string]string, error) {
		rows, err := tx.Query(ctx, `SELECT c.relname, i.indisprimary::text || i.indisunique::text || regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '')
			FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, table)
		if err != nil {
			return nil, fmt.Errorf("indexes of %s: %w", table, err)
		}
		byDef := map[string]string{}
		for rows.Next() {
			var name, def string
			if err := rows.Scan(&name, &def); err != nil {
				rows.Close()
				return nil, fmt.Errorf("indexes of %s: %w", table, err)
			}
			byDef[def] = name
		}
		rows.Close()
		return byDef, rows.Err()
	}
	liveIdx, err := list(live)
	if err != nil {
		return nil, err
	}
	shadowIdx, err := list(shadow)
	if err != nil {
		return nil, err
	}
	var out []string
	for def, name := range liveIdx {
		sname, ok := shadowIdx[def]
		if !ok {
			return nil, fmt.Errorf("index %s of %s has no twin in %s: the table changed during the rebuild", name, live, shadow)
		}
		oldName := old + strings.TrimPrefix(name, "sensor_state")
		if len(oldName) > 63 {
			oldName = oldName[:63]
		}
		out = append(out, `ALTER INDEX `+pgx.Identifier{name}.Sanitize()+` RENAME TO `+pgx.Identifier{oldName}.Sanitize(),
			`ALTER INDEX `+pgx.Identifier{sname}.Sanitize()+` RENAME TO `+pgx.Identifier{name}.Sanitize())
	}
	// All old names first: a shadow index must not take a name still in use.
	var first, second []string
	for i, s := range out {
		if i%2 == 0 {
			first = append(first, s)
		} else {
			second = append(second, s)
		}
	}
	return append(first, second...), nil
}

// DropOld drops the tables earlier swaps replaced and returns their names.
func DropOld(ctx context.Context, pg *pgxpool.Pool) ([]string, error) {
	// Partitions go with their table.
	rows, err := pg.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace
		AND relkind IN ('r', 'p') AND NOT relispartition AND relname LIKE $1 ORDER BY relname`,
		strings.ReplaceAll(OldTablePrefix, "_", `\_`)+"%")
	if err != nil {
		return nil, fmt.Errorf("list old state tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list old state tables: %w", err)
	}
	for _, n := range names {
		if _, err := pg.Exec(ctx, `DROP TABLE `+pgx.Identifier{n}.Sanitize()); err != nil {
			return nil, fmt.Errorf("drop %s: %w", n, err)
		}
	}
	return names, nil
}

// continueRevisions makes the shadow of a rebuild from a READINGS that no longer holds its
// start keep what only the live rows know: a sensor's revision never goes back (the next
// event gets a new id), and a sensor none of whose readings is kept stays as it was.
func continueRevisions(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `UPDATE `+ShadowTable+` s SET revision = l.revision
		FROM sensor_state l WHERE l.sensor_id = s.sensor_id AND l.revision > s.revision`); err != nil {
		return fmt.Errorf("continue the live revisions: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+ShadowTable+` SELECT l.* FROM sensor_state l
		WHERE NOT EXISTS (SELECT 1 FROM `+ShadowTable+` s WHERE s.sensor_id = l.sensor_id)`); err != nil {
		return fmt.Errorf("keep the sensors without kept readings: %w", err)
	}
	return nil
}
