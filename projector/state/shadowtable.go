package state

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A rebuild's shadow has sensor_state's shape: columns, constraints, indexes, storage
// options and, since migration 00070, its partitioning and partitions. LIKE copies none of
// the last two, so they are read from the catalog; a shadow swapped in is then partitioned
// as the table it replaced.

// partitionOf is one partition of a partitioned table: its name, bound and storage options.
type partitionOf struct {
	name, bound, opts string
}

// partitions lists table's partitions (none when it is not partitioned), by name.
func partitions(ctx context.Context, tx pgx.Tx, table string) ([]partitionOf, error) {
	rows, err := tx.Query(ctx, `SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), coalesce(array_to_string(c.reloptions, ', '), '')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass ORDER BY c.relname`, table)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", table, err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partitionOf, error) {
		var p partitionOf
		err := r.Scan(&p.name, &p.bound, &p.opts)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", table, err)
	}
	return ps, nil
}

// shadowDDL is the DDL that creates ShadowTable shaped like sensor_state.
func shadowDDL(ctx context.Context, tx pgx.Tx) ([]string, error) {
	var key, opts string
	if err := tx.QueryRow(ctx, `SELECT coalesce(pg_get_partkeydef(oid), ''), coalesce(array_to_string(reloptions, ', '), '')
		FROM pg_class WHERE oid = 'sensor_state'::regclass`).Scan(&key, &opts); err != nil {
		return nil, fmt.Errorf("sensor_state's shape: %w", err)
	}
	create := `CREATE TABLE ` + ShadowTable + ` (LIKE sensor_state INCLUDING ALL)`
	if key == "" {
		stmts := []string{create}
		if opts != "" {
			stmts = append(stmts, `ALTER TABLE `+ShadowTable+` SET (`+opts+`)`)
		}
		return stmts, nil
	}
	ps, err := partitions(ctx, tx, "sensor_state")
	if err != nil {
		return nil, err
	}
	stmts := []string{create + ` PARTITION BY ` + key}
	for _, p := range ps {
		q := `CREATE TABLE ` + pgx.Identifier{shadowPartition(p.name)}.Sanitize() + ` PARTITION OF ` + ShadowTable + ` ` + p.bound
		if p.opts != "" {
			q += ` WITH (` + p.opts + `)`
		}
		stmts = append(stmts, q)
	}
	return stmts, nil
}

// shadowPartition is the shadow's twin of sensor_state's partition live
// (sensor_state_p03: sensor_state_rebuild_p03).
func shadowPartition(live string) string {
	return ShadowTable + strings.TrimPrefix(live, "sensor_state")
}

// partitionRenames gives, at a swap, the live partitions and their indexes names of the old
// table, and the shadow's partitions and indexes the live names, so that the next rebuild
// finds the names it makes free.
func partitionRenames(ctx context.Context, tx pgx.Tx, old string) ([]string, error) {
	ps, err := partitions(ctx, tx, "sensor_state")
	if err != nil {
		return nil, err
	}
	var first, second []string
	for _, p := range ps {
		shadow := shadowPartition(p.name)
		idx, err := indexRenames(ctx, tx, p.name, shadow, old)
		if err != nil {
			return nil, err
		}
		oldName := old + strings.TrimPrefix(p.name, "sensor_state")
		first = append(first, `ALTER TABLE `+pgx.Identifier{p.name}.Sanitize()+` RENAME TO `+pgx.Identifier{oldName}.Sanitize())
		second = append(second, idx...)
		second = append(second, `ALTER TABLE `+pgx.Identifier{shadow}.Sanitize()+` RENAME TO `+pgx.Identifier{p.name}.Sanitize())
	}
	return append(first, second...), nil
}
