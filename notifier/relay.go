package notifier

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/outbox"
)

// Attempt records leave through notifier_attempt_outbox (written with the outcome they
// record) for DELIVERIES. Every notifier process relays the one table, so rows are locked.
const (
	relaySelect = `SELECT id, client_id, msg_id, payload FROM notifier_attempt_outbox
		ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	relayDelete = `DELETE FROM notifier_attempt_outbox WHERE id = ANY($1)`
	// relayLinger lets records gather after a wake-up, so a relay transaction carries many
	// instead of one per finished batch: records need not be instant.
	relayLinger = 20 * time.Millisecond
	// relayDrain bounds the last round at stop, for what the finisher wrote while stopping.
	relayDrain = 3 * time.Second
)

func newAttemptRelay(cfg Config, d Deps) (*outbox.Relay, error) {
	return outbox.New(outbox.Config{
		Name:  "notifier attempts",
		Batch: cfg.Batch, Linger: relayLinger, DrainTimeout: relayDrain,
		Table: outbox.Table{Select: relaySelect, Delete: relayDelete, Shared: true, Scan: scanAttemptRow},
	}, outbox.Deps{Logger: d.Logger, Registerer: prometheus.WrapRegistererWith(prometheus.Labels{"outbox": "notifier_attempts"}, d.Registerer), JS: d.JS, PG: d.PG})
}

// scanAttemptRow is a record for DELIVERIES, by client, with its attempt message id.
func scanAttemptRow(rows pgx.Rows) (outbox.Row, error) {
	var o outbox.Row
	var client string
	err := rows.Scan(&o.ID, &client, &o.MsgID, &o.Data)
	o.Subject = natsx.DeliveriesSubject(client)
	return o, err
}
