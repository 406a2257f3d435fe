package history

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
)

// RetentionEveryDefault is how often the history projector looks for months past
// Config.Retention.
const RetentionEveryDefault = time.Hour

// retain drops expired months every RetentionEvery until ctx is done. ClickHouse 18.16 has no
// TTL clause, and the tables are partitioned by receive month, so whole partitions go at once.
func (h *Projector) retain(ctx context.Context) {
	for {
		dropped, err := h.dropExpired(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			h.log.Warn("history retention", "err", err)
		}
		for _, d := range dropped {
			h.log.Info("dropped a month of history past the retention", "partition", d, "retention", h.cfg.Retention)
		}
		if !backoff.Sleep(ctx, h.cfg.RetentionEvery) {
			return
		}
	}
}

// dropExpired drops every partition (month) of the history tables that ended, a day of time
// zone slack included, more than Retention before now, and returns them as table/partition.
// A Distributed table of a cluster has no parts of its own, so nothing is dropped there: a
// cluster uses a TTL clause instead (docs/operations.md, "Retention").
func (h *Projector) dropExpired(ctx context.Context, now time.Time) ([]string, error) {
	var names []string
	for _, t := range tables {
		names = append(names, t.name)
	}
	rows, err := h.ch.Query(ctx, `SELECT DISTINCT table, partition FROM system.parts
		WHERE database = currentDatabase() AND active AND has(?, table)`, names)
	if err != nil {
		return nil, fmt.Errorf("list history partitions: %w", err)
	}
	type part struct{ table, partition string }
	var expired []part
	cutoff := now.Add(-h.cfg.Retention)
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.table, &p.partition); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list history partitions: %w", err)
		}
		yyyymm, err := strconv.Atoi(p.partition)
		if err != nil || yyyymm < 100001 {
			continue // not a month: a table partitioned otherwise is left alone
		}
		end := time.Date(yyyymm/100, time.Month(yyyymm%100)+1, 1, 0, 0, 0, 0, time.UTC)
		if end.Add(24 * time.Hour).Before(cutoff) {
			expired = append(expired, p)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list history partitions: %w", err)
	}
	var dropped []string
	for _, p := range expired {
		if err := h.ch.Exec(ctx, fmt.Sprintf("ALTER TABLE `%s` DROP PARTITION %s", p.table, p.partition)); err != nil {
			return dropped, fmt.Errorf("drop partition %s of %s: %w", p.partition, p.table, err)
		}
		dropped = append(dropped, p.table+"/"+p.partition)
	}
	return dropped, nil
}
