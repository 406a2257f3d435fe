package watchdog

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// recordSweep keeps each swept partition's result in watchdog_sweeps, where the alerter reads
// it (reconciliation_drift fires while a partition's last sweep had to repair something, and
// resolves with a later sweep that repaired nothing).
func (w *Watchdog) recordSweep(ctx context.Context, repairs map[int]int) error {
	if len(repairs) == 0 {
		return nil
	}
	parts := slices.Sorted(maps.Keys(repairs))
	counts := make([]int, len(parts))
	for i, p := range parts {
		counts[i] = repairs[p]
	}
	_, err := w.pg.Exec(ctx, `INSERT INTO watchdog_sweeps (partition, swept_at, repairs)
		SELECT p, now(), r FROM unnest($1::int[], $2::int[]) AS t(p, r)
		ON CONFLICT (partition) DO UPDATE SET swept_at = excluded.swept_at, repairs = excluded.repairs`, parts, counts)
	if err != nil {
		return fmt.Errorf("record the sweep: %w", err)
	}
	return nil
}
