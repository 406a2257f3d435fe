package watchdog

import (
	"context"
	"fmt"
	"time"
)

// lostAfter is the timeout in force for a sensor: its override, or the default.
func (w *Watchdog) lostAfter(sensor string) time.Duration {
	if d, ok := (*w.overrides.Load())[sensor]; ok {
		return d
	}
	return w.cfg.LostAfter
}

// loadOverrides replaces the per-sensor timeouts (sensors.lost_after_ms, set through the API).
func (w *Watchdog) loadOverrides(ctx context.Context) error {
	rows, err := w.pg.Query(ctx, `SELECT id, lost_after_ms FROM sensors WHERE lost_after_ms IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("read sensors.lost_after_ms: %w", err)
	}
	defer rows.Close()
	m := map[string]time.Duration{}
	for rows.Next() {
		var id string
		var ms int64
		if err := rows.Scan(&id, &ms); err != nil {
			return fmt.Errorf("read sensors.lost_after_ms: %w", err)
		}
		d := time.Duration(ms) * time.Millisecond
		if d < time.Second {
			d = time.Second // the server's TTLs are whole seconds
		}
		m[id] = d
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read sensors.lost_after_ms: %w", err)
	}
	w.overrides.Store(&m)
	return nil
}
