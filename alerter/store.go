package alerter

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Alert kinds (alerts.kind).
const (
	KindDeadLetter          = "dead_letter"
	KindEndpointDisabled    = "endpoint_disabled"
	KindProjectionLag       = "projection_lag"
	KindSetAside            = "set_aside"
	KindCheckpointMismatch  = "checkpoint_mismatch"
	KindReconciliationDrift = "reconciliation_drift"
	KindMassLoss            = "mass_loss"
	KindPartStopped         = "part_stopped"
)

// Notice events and channels (alert_notices.event, .channel).
const (
	eventFiring    = "firing"
	eventResolved  = "resolved"
	channelEmail   = "email"
	channelWebhook = "webhook"
)

// condition is one (kind, subject) whose condition holds now.
type condition struct {
	summary string
	details map[string]any
	// watermark is the source position the condition covers (set_aside), kept on the row.
	watermark int64
}

// reconcile makes the firing alerts of kind match conds, in one transaction with the
// notices of every transition: a subject that holds and is not firing fires; a firing one
// that no longer holds resolves. A firing alert's details follow its condition silently.
func (a *Alerter) reconcile(ctx context.Context, kind string, conds map[string]condition) error {
	fired, resolved := 0, 0
	err := pgx.BeginFunc(ctx, a.d.PG, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, subject FROM alerts WHERE kind = $1 AND resolved_at IS NULL FOR UPDATE`, kind)
		if err != nil {
			return err
		}
		firing, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
			id      int64
			subject string
		}, error) {
			var v struct {
				id      int64
				subject string
			}
			return v, r.Scan(&v.id, &v.subject)
		})
		if err != nil {
			return err
		}
		open := map[string]int64{}
		for _, f := range firing {
			open[f.subject] = f.id
		}
		tr := transitionsOf(open, conds)
		for subject, id := range tr.still {
			c := conds[subject]
			details, _ := json.Marshal(c.details)
			if _, err := tx.Exec(ctx, `UPDATE alerts SET summary = $2, details = $3, watermark = greatest(watermark, $4) WHERE id = $1`,
				id, c.summary, details, c.watermark); err != nil {
				return err
			}
		}
		for _, id := range tr.resolve {
			if _, err := tx.Exec(ctx, `UPDATE alerts SET resolved_at = now() WHERE id = $1`, id); err != nil {
				return err
			}
			if err := a.addNotices(ctx, tx, id, eventResolved); err != nil {
				return err
			}
			resolved++
		}
		for _, subject := range tr.fire {
			c := conds[subject]
			details, _ := json.Marshal(c.details)
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO alerts (kind, subject, summary, details, watermark) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
				kind, subject, c.summary, details, c.watermark).Scan(&id); err != nil {
				return err
			}
			if err := a.addNotices(ctx, tx, id, eventFiring); err != nil {
				return err
			}
			fired++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply the %s alerts: %w", kind, err)
	}
	a.m.firing.WithLabelValues(kind).Set(float64(len(conds)))
	if fired+resolved > 0 {
		a.m.transitions.WithLabelValues(kind, eventFiring).Add(float64(fired))
		a.m.transitions.WithLabelValues(kind, eventResolved).Add(float64(resolved))
		a.log.Info("alerts changed", "kind", kind, "fired", fired, "resolved", resolved)
	}
	return nil
}

// addNotices queues the notice of alert id's event on every configured channel.
func (a *Alerter) addNotices(ctx context.Context, tx pgx.Tx, id int64, event string) error {
	for _, ch := range a.cfg.channels() {
		if _, err := tx.Exec(ctx, `INSERT INTO alert_notices (alert_id, event, channel) VALUES ($1, $2, $3)
			ON CONFLICT DO NOTHING`, id, event, ch); err != nil {
			return err
		}
	}
	return nil
}

// lastWatermark is the highest watermark of any alert of (kind, subject), firing or not.
func (a *Alerter) lastWatermark(ctx context.Context, kind, subject string) (int64, error) {
	var w int64
	err := a.d.PG.QueryRow(ctx, `SELECT coalesce(max(watermark), 0) FROM alerts WHERE kind = $1 AND subject = $2`, kind, subject).Scan(&w)
	return w, err
}
