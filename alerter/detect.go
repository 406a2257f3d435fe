package alerter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// detector evaluates one kind: the subjects whose condition holds now.
type detector struct {
	kind   string
	detect func(ctx context.Context) (map[string]condition, error)
}

// newDetectors are the detectors this alerter runs: projection_lag needs Deps.Projections.
func (a *Alerter) newDetectors() []detector {
	return slices.DeleteFunc(a.allDetectors(), func(d detector) bool {
		return d.kind == KindProjectionLag && a.d.Projections == nil
	})
}

// allDetectors is every kind the alerter can raise (Kinds lists them).
func (a *Alerter) allDetectors() []detector {
	return []detector{
		{KindDeadLetter, a.deadLetters},
		{KindEndpointDisabled, a.disabledEndpoints},
		{KindSetAside, a.setAside},
		{KindCheckpointMismatch, a.checkpointMismatch},
		{KindReconciliationDrift, a.reconciliationDrift},
		{KindMassLoss, a.massLoss},
		{KindPartStopped, a.partStopped},
		{KindProjectionLag, a.projectionLag},
	}
}

// collect reads rows into conditions keyed by subject.
func collect(rows pgx.Rows, err error, scan func(pgx.Rows) (string, condition, error)) (map[string]condition, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]condition{}
	for rows.Next() {
		subject, c, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out[subject] = c
	}
	return out, rows.Err()
}

// deadLetters: a client has dead deliveries; resolved when it has none (redriven or resent).
func (a *Alerter) deadLetters(ctx context.Context) (map[string]condition, error) {
	rows, err := a.d.PG.Query(ctx, `SELECT client_id, count(*), max(updated_at) FROM notifier_deliveries
		WHERE state = 'dead' GROUP BY client_id`)
	return collect(rows, err, func(r pgx.Rows) (string, condition, error) {
		var client string
		var n int64
		var last time.Time
		if err := r.Scan(&client, &n, &last); err != nil {
			return "", condition{}, err
		}
		return "client/" + client, condition{
			summary: fmt.Sprintf("client %s has %d dead-lettered deliveries (GET /v1/clients/%s/deliveries?state=dead; redrive them once the endpoint is fixed)", client, n, client),
			details: map[string]any{"client_id": client, "dead": n, "last_dead_at": last.UTC()},
		}, nil
	})
}

// disabledEndpoints: a client's endpoint was disabled (clients.disabled_at); resolved when
// it is enabled again.
func (a *Alerter) disabledEndpoints(ctx context.Context) (map[string]condition, error) {
	rows, err := a.d.PG.Query(ctx, `SELECT id, webhook_url, disabled_at, coalesce(disabled_reason, '') FROM clients WHERE disabled_at IS NOT NULL`)
	return collect(rows, err, func(r pgx.Rows) (string, condition, error) {
		var client, url, reason string
		var at time.Time
		if err := r.Scan(&client, &url, &at, &reason); err != nil {
			return "", condition{}, err
		}
		return "client/" + client, condition{
			summary: fmt.Sprintf("the webhook endpoint of client %s was disabled at %s: %s", client, at.UTC().Format(time.RFC3339), reason),
			details: map[string]any{"client_id": client, "disabled_at": at.UTC(), "reason": reason},
		}, nil
	})
}

// reconciliationDrift: the watchdog's last sweep of a partition had to repair something;
// resolved by a later sweep that repaired nothing.
func (a *Alerter) reconciliationDrift(ctx context.Context) (map[string]condition, error) {
	rows, err := a.d.PG.Query(ctx, `SELECT partition, repairs, swept_at FROM watchdog_sweeps WHERE repairs > 0`)
	return collect(rows, err, func(r pgx.Rows) (string, condition, error) {
		var p, n int
		var at time.Time
		if err := r.Scan(&p, &n, &at); err != nil {
			return "", condition{}, err
		}
		return "partition/" + strconv.Itoa(p), condition{
			summary: fmt.Sprintf("the watchdog's sweep of partition %d at %s repaired %d liveness keys that differed from the state projection", p, at.UTC().Format(time.RFC3339), n),
			details: map[string]any{"partition": p, "repairs": n, "swept_at": at.UTC()},
		}, nil
	})
}

// massLoss: more than MassLossShare of the sensors (and at least MassLossMin) are lost and
// went silent within one MassLossWindow of each other, which is more likely a site or
// network outage than dead sensors; resolved when no such group is lost any more.
func (a *Alerter) massLoss(ctx context.Context) (map[string]condition, error) {
	var total, group int64
	var from, to *time.Time
	err := a.d.PG.QueryRow(ctx, `WITH lost AS (
			SELECT last_seen, count(*) OVER (ORDER BY last_seen RANGE BETWEEN CURRENT ROW AND $1::interval FOLLOWING) AS n
			FROM sensor_state WHERE connection = 'lost'),
		best AS (SELECT last_seen, n FROM lost ORDER BY n DESC, last_seen LIMIT 1)
		SELECT (SELECT count(*) FROM sensor_state), coalesce((SELECT n FROM best), 0),
			(SELECT last_seen FROM best), (SELECT last_seen + $1::interval FROM best)`,
		a.cfg.MassLossWindow).Scan(&total, &group, &from, &to)
	if err != nil {
		return nil, fmt.Errorf("count lost sensors: %w", err)
	}
	out := map[string]condition{}
	if !massLost(total, group, a.cfg.MassLossMin, a.cfg.MassLossShare) {
		return out, nil
	}
	out["sensors"] = condition{
		summary: fmt.Sprintf("%d of %d sensors are lost, all silent since within %s of %s: more likely a site or network outage than dead sensors",
			group, total, a.cfg.MassLossWindow, from.UTC().Format(time.RFC3339)),
		details: map[string]any{"lost_together": group, "sensors": total, "silent_from": from.UTC(), "silent_to": to.UTC()},
	}
	return out, nil
}

// checkpointMismatch: a Postgres checkpoint that does not belong to the READINGS stream
// (written on another stream, or ahead of its end), as the state projector judges it
// (projector/state/checkpoint.go); resolved when it fits again (a rebase or a restore).
func (a *Alerter) checkpointMismatch(ctx context.Context) (map[string]condition, error) {
	type cp struct {
		projection, stream string
		partition          int
		seq                uint64
	}
	// Checkpoints first, then the stream: a checkpoint written meanwhile is then never
	// ahead of the stream as read.
	rows, err := a.d.PG.Query(ctx, `SELECT projection, partition, seq, coalesce(stream, '') FROM checkpoints WHERE seq > 0`)
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	cps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cp, error) {
		var c cp
		var seq int64
		err := r.Scan(&c.projection, &c.partition, &seq, &c.stream)
		c.seq = uint64(seq)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	st, err := a.d.JS.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	info := st.CachedInfo()
	id := natsx.StreamIdentity(info)
	out := map[string]condition{}
	for _, c := range cps {
		if c.seq <= info.State.LastSeq && (c.stream == "" || c.stream == id) {
			continue
		}
		why := fmt.Sprintf("checkpoint %d is ahead of READINGS, which ends at %d", c.seq, info.State.LastSeq)
		if c.stream != "" && c.stream != id {
			why = fmt.Sprintf("checkpoint %d was written on READINGS created %s, but READINGS now is the stream created %s", c.seq, c.stream, id)
		}
		out[c.projection+"/"+strconv.Itoa(c.partition)] = condition{
			summary: fmt.Sprintf("projection %s stopped partition %d: %s (see docs/recovery.md, \"When the log and the database disagree\")", c.projection, c.partition, why),
			details: map[string]any{"projection": c.projection, "partition": c.partition, "checkpoint": c.seq,
				"checkpoint_stream": c.stream, "readings_stream": id, "readings_last_seq": info.State.LastSeq},
		}
	}
	return out, nil
}
