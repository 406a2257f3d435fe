package notifier

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/webhookctl"
)

// Controls are the operator's webhook controls over the notifier's tables: re-enable and
// disable an endpoint, resend one delivery, send a test event, and a client's statistics (the
// admin API's Controls). Each action that says the endpoint is fixed resets the client's
// circuit breaker in every notifier process over core NATS (listenResets).
type Controls struct {
	db DB
	nc *nats.Conn
}

// ControlsDeps are what the controls work on: the notifier's tables in PG, and NC to
// announce resets and registry changes to every notifier process.
type ControlsDeps struct {
	PG DB
	NC *nats.Conn
}

// NewControls serves the controls on the tables of d.PG, announcing resets on d.NC.
func NewControls(d ControlsDeps) *Controls { return &Controls{db: d.PG, nc: d.NC} }

// Reset tells every notifier process to close client's breaker and send at once.
func (c *Controls) Reset(ctx context.Context, client string) error {
	if err := c.nc.Publish(natsx.NotifierResetSubject(client), nil); err != nil {
		return fmt.Errorf("publish endpoint reset: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second) // Flush needs a deadline
	defer cancel()
	if err := c.nc.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("publish endpoint reset: %w", err)
	}
	return nil
}

// Changed tells every notifier process that client's registry entry changed, so that rows
// claimed ahead for it are read afresh before they are sent. Best effort: a lost message
// leaves them at most queueMaxWait old.
func (c *Controls) Changed(client string) error {
	if err := c.nc.Publish(natsx.NotifierChangedSubject(client), nil); err != nil {
		return fmt.Errorf("publish registry change: %w", err)
	}
	return nil
}

// Enable re-enables client's endpoint: its failures are forgotten, its pending deliveries
// (those that waited while it was disabled, and those waiting for a retry) are due now, in
// order, and every notifier resets its breaker. It reports whether the client was disabled.
func (c *Controls) Enable(ctx context.Context, client string) (bool, error) {
	var was bool
	// Deliveries, health, then clients: the order finish locks them in.
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE notifier_deliveries SET next_at = now(), updated_at = now()
			WHERE client_id = $1 AND state = 'pending' AND next_at > now()`, client); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE notifier_endpoint_health SET failing_since = NULL WHERE client_id = $1`, client); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE clients SET disabled_at = NULL, disabled_reason = NULL, version = version + 1, updated_at = now()
			WHERE id = $1 AND disabled_at IS NOT NULL`, client)
		was = tag.RowsAffected() > 0
		return err
	})
	if err != nil {
		return false, fmt.Errorf("enable endpoint: %w", err)
	}
	return was, c.Reset(ctx, client)
}

// Disable disables client's endpoint for reason: its deliveries wait, pending, until Enable.
// It reports whether the client was enabled.
func (c *Controls) Disable(ctx context.Context, client, reason string) (bool, error) {
	tag, err := c.db.Exec(ctx, `UPDATE clients SET disabled_at = now(), disabled_reason = $2, version = version + 1, updated_at = now()
		WHERE id = $1 AND disabled_at IS NULL`, client, reason)
	if err != nil {
		return false, fmt.Errorf("disable endpoint: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// Resend sends client's delivery of eventID again, with a fresh schedule, if it is dead or
// delivered (wrapping webhookctl.ErrNoDelivery, ErrNotFinished or ErrSuperseded otherwise:
// a delivery of a sensor the client has since had a newer event of is never sent again,
// which would put an older revision after a newer one). Every notifier resets its breaker.
func (c *Controls) Resend(ctx context.Context, client, eventID string) error {
	err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		var state string
		var newer *int64
		err := tx.QueryRow(ctx, `SELECT d.state, (SELECT max(o.revision) FROM notifier_deliveries o
				WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.revision > d.revision)
			FROM notifier_deliveries d WHERE d.client_id = $1 AND d.event_id = $2 FOR UPDATE`, client, eventID).Scan(&state, &newer)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: client %s has no delivery of event %s", webhookctl.ErrNoDelivery, client, eventID)
		case err != nil:
			return err
		case newer != nil:
			return fmt.Errorf("%w: the client has revision %d of the sensor; resend that event instead", webhookctl.ErrSuperseded, *newer)
		case state != StateDead && state != StateDelivered:
			return fmt.Errorf("%w: it is %s", webhookctl.ErrNotFinished, state)
		}
		_, err = tx.Exec(ctx, `UPDATE notifier_deliveries SET state = 'pending', attempt_base = attempts, next_at = now(),
				supersede_on_finish = false, updated_at = now()
			WHERE client_id = $1 AND event_id = $2`, client, eventID)
		return err
	})
	if err != nil {
		return fmt.Errorf("resend delivery: %w", err)
	}
	return c.Reset(ctx, client)
}

// SendTest queues a sensor.test webhook for client, signed and recorded like any delivery
// (its sensor id is empty and its revision 0), and returns its event id.
func (c *Controls) SendTest(ctx context.Context, client string) (string, error) {
	b := make([]byte, 15)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random event id: %w", err)
	}
	now := time.Now().UTC()
	id := fmt.Sprintf("evt_test_%x", b)
	payload, err := json.Marshal(event.Event{V: event.Version, ID: id, Type: "test", OccurredAt: now, SensorID: testSensorID})
	if err != nil {
		return "", fmt.Errorf("encode test event: %w", err)
	}
	// The row's revision orders the client's test deliveries among themselves.
	if _, err := c.db.Exec(ctx, `INSERT INTO notifier_deliveries (event_id, client_id, sensor_id, revision, payload, state)
		VALUES ($1, $2, $3, $4, $5, 'pending')`, id, client, testSensorID, now.UnixMicro(), payload); err != nil {
		return "", fmt.Errorf("queue test event: %w", err)
	}
	return id, c.Reset(ctx, client)
}

// Stats are client's delivery figures over the rows the delivery table holds: every pending
// and dead delivery, and the finished ones of the retention (Config.Retention, 7 days).
func (c *Controls) Stats(ctx context.Context, client string) (webhookctl.Stats, error) {
	var s webhookctl.Stats
	var p50, p90, p99 *float64
	var last, disabled *time.Time
	var reason *string
	err := c.db.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE d.state = 'delivered'), coalesce(sum(d.failed_attempts), 0),
		       count(*) FILTER (WHERE d.attempts > 1), count(*) FILTER (WHERE d.state = 'dead'),
		       count(*) FILTER (WHERE d.state = 'pending'),
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY d.last_latency_ms) FILTER (WHERE d.state = 'delivered'),
		       percentile_cont(0.9) WITHIN GROUP (ORDER BY d.last_latency_ms) FILTER (WHERE d.state = 'delivered'),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY d.last_latency_ms) FILTER (WHERE d.state = 'delivered'),
		       max(d.updated_at) FILTER (WHERE d.state = 'delivered'),
		       (SELECT disabled_at FROM clients WHERE id = $1), (SELECT disabled_reason FROM clients WHERE id = $1)
		FROM notifier_deliveries d WHERE d.client_id = $1`, client).Scan(&s.Delivered, &s.FailedAttempts, &s.Retried, &s.Dead,
		&s.Pending, &p50, &p90, &p99, &last, &disabled, &reason)
	if err != nil {
		return s, fmt.Errorf("client stats: %w", err)
	}
	ms := func(v *float64) time.Duration {
		if v == nil {
			return 0
		}
		return time.Duration(*v * float64(time.Millisecond))
	}
	s.LatencyP50, s.LatencyP90, s.LatencyP99 = ms(p50), ms(p90), ms(p99)
	if last != nil {
		s.LastSuccess = *last
	}
	if disabled != nil {
		s.DisabledAt = *disabled
	}
	if reason != nil {
		s.DisabledReason = *reason
	}
	return s, nil
}
