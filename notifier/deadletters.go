package notifier

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// DeadLetters are the dead-lettered deliveries in the notifier's delivery table: the admin
// API's DeadLetters (api.DeadLetters).
type DeadLetters struct {
	db DB
}

// DeadLettersDeps are what the dead letters are read from: the delivery table in PG.
type DeadLettersDeps struct {
	PG DB
}

// NewDeadLetters serves the dead letters of the delivery table in d.PG.
func NewDeadLetters(d DeadLettersDeps) *DeadLetters { return &DeadLetters{db: d.PG} }

// ListDead lists a client's dead deliveries, oldest dead first, after the one with id
// afterID (0 for the first page), at most limit (1 to 1000).
func (dl *DeadLetters) ListDead(ctx context.Context, clientID string, afterID int64, limit int) ([]event.DeadDelivery, error) {
	if limit < 1 || limit > 1000 {
		limit = 100
	}
	rows, err := dl.db.Query(ctx, `SELECT `+deadColumns+`
		FROM notifier_deliveries WHERE client_id = $1 AND state = 'dead' AND id > $2
		ORDER BY id LIMIT $3`, clientID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead deliveries: %w", err)
	}
	return scanDead(rows)
}

// deadColumns are what ListDead and ListAllDead read of a dead row, for scanDead.
const deadColumns = `id, event_id, client_id, sensor_id, revision, attempts,
			coalesce(last_status, 0), coalesce(last_error, ''), created_at, updated_at, payload`

// ListAllDead lists the dead deliveries of every client, newest first (by row id) before
// beforeID (0: from the newest), at most limit (1 to 1000): the operator's view, one query
// whatever the number of clients (the partial index notifier_deliveries_dead_id).
func (dl *DeadLetters) ListAllDead(ctx context.Context, beforeID int64, limit int) ([]event.DeadDelivery, error) {
	if limit < 1 || limit > 1000 {
		limit = 100
	}
	if beforeID <= 0 {
		beforeID = math.MaxInt64
	}
	rows, err := dl.db.Query(ctx, `SELECT `+deadColumns+`
		FROM notifier_deliveries WHERE state = 'dead' AND id < $1
		ORDER BY id DESC LIMIT $2`, beforeID, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead deliveries: %w", err)
	}
	return scanDead(rows)
}

func scanDead(rows pgx.Rows) ([]event.DeadDelivery, error) {
	defer rows.Close()
	var out []event.DeadDelivery
	for rows.Next() {
		var d event.DeadDelivery
		var payload []byte
		if err := rows.Scan(&d.ID, &d.EventID, &d.ClientID, &d.SensorID, &d.Revision, &d.Attempts,
			&d.LastStatus, &d.LastError, &d.CreatedAt, &d.DeadAt, &payload); err != nil {
			return nil, fmt.Errorf("list dead deliveries: %w", err)
		}
		if e, err := event.DecodeEvent(payload); err == nil {
			d.Event = e
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead deliveries: %w", err)
	}
	return out, nil
}

// Redrive sends a client's dead deliveries again, those that died in [from, to) (a zero
// time leaves that end open), each with a fresh schedule of attempts. A dead delivery of a
// sensor for which the client has since had a newer event is superseded instead: redrive
// never sends an older revision after a newer one. It returns how many will be sent.
func (dl *DeadLetters) Redrive(ctx context.Context, clientID string, from, to time.Time) (int64, error) {
	var f, t *time.Time
	if !from.IsZero() {
		f = &from
	}
	if !to.IsZero() {
		t = &to
	}
	var n int64
	err := pgx.BeginFunc(ctx, dl.db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `
			WITH dead AS (
				SELECT id FROM notifier_deliveries
				WHERE client_id = $1 AND state = 'dead'
				  AND ($2::timestamptz IS NULL OR updated_at >= $2) AND ($3::timestamptz IS NULL OR updated_at < $3)
				FOR UPDATE
			), u AS (
				UPDATE notifier_deliveries d SET
					state = `+enqueueStateSQL(newerExists)+`,
					attempt_base = d.attempts, next_at = now(), updated_at = now()
				FROM dead WHERE d.id = dead.id
				RETURNING d.state
			)
			SELECT count(*) FILTER (WHERE state = 'pending') FROM u`, clientID, f, t).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("redrive dead deliveries: %w", err)
	}
	return n, nil
}
