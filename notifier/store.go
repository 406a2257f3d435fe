package notifier

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

// DB is what the notifier needs of Postgres (a *pgxpool.Pool is one).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// States of a delivery row.
const (
	StatePending    = "pending"
	StateDelivered  = "delivered"
	StateDead       = "dead"
	StateCancelled  = "cancelled"
	StateSuperseded = "superseded"
)

// outcomeOf is the attempt outcome recorded for a row that ends an attempt in state.
func outcomeOf(state string) string {
	switch state {
	case StatePending:
		return event.OutcomeRetry
	case StateDelivered:
		return event.OutcomeDelivered
	case StateDead:
		return event.OutcomeDead
	case StateCancelled:
		return event.OutcomeCancelled
	default:
		return event.OutcomeSuperseded
	}
}

// testSensorID is the sensor_id of a test delivery (SendTest): no sensor has an empty id, so
// test deliveries are ordered among themselves, apart from every sensor's.
const testSensorID = ""

// newerExists is true for a row d when a row of a higher revision exists for the same
// (client, sensor), in any state: from then on d must never be sent.
const newerExists = `EXISTS (SELECT 1 FROM notifier_deliveries o
	WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.revision > d.revision OFFSET 0)`

// insertDeliveries creates one delivery per (event, subscribed client) in tx, idempotently by
// (event_id, client_id) (the unique key adds sensor_id, the table's partition key, which the
// event id determines), and supersedes the older rows of the keys it touched. It returns the
// attempt records of what was superseded, for the outbox; the first late of them are rows
// created superseded because the client already had a newer revision of the sensor, which
// the in-order intake never lets happen: an error for the caller to report.
// tps, when not nil, are the events' traceparents, kept on their deliveries. The statements
// go out after those f queues, in the transaction's first round trip, and leave it with
// generic plans and sequential scans off.
func insertDeliveries(ctx context.Context, tx *pgtx.Tx, f fence, evs []event.Event, payloads [][]byte, tps []string) (ins inserted, recs []event.Attempt, late int, err error) {
	// Generic plans for these statements (pgtx.GenericPlans): they probe key by key (LATERAL
	// subqueries kept apart with OFFSET 0), a plan that does not depend on the arguments.
	b := &pgx.Batch{}
	if f.queue != nil {
		f.queue(b)
	}
	b.Queue(pgtx.GenericPlans)
	queueInsert(b, evs, payloads, tps)
	if err := tx.Send(ctx, b, func(br pgx.BatchResults) error {
		ins, recs, err = readInsert(br, f)
		return err
	}); err != nil {
		return ins, nil, 0, err
	}
	late = len(recs)
	if len(ins.keyClients) == 0 {
		return ins, recs, late, nil
	}
	more, err := supersede(ctx, tx.Conn(), ins.keyClients, ins.keySensors)
	return ins, append(recs, more...), late, err
}

// fence is what a transaction checks in its first round trip before anything else
// (lease.QueueCheck and ReadCheck); the zero fence checks nothing.
type fence struct {
	queue func(*pgx.Batch)
	read  func(pgx.BatchResults) error
}

// inserted is what insertDeliveries created: how many rows, and the pending ones (the rest
// were superseded at once), which the notifier may lease at intake.
type inserted struct {
	created int
	ids     []int64
	clients []string
	sensors []string
	// keyClients and keySensors are the (client, sensor) keys of the rows created whose key
	// may have rows to supersede (sweepHint).
	keyClients, keySensors []string
}

// insertTemplate is the INSERT of insertAndSupersede; its variant with a traceparent per
// event (insertTracedSQL) runs only while tracing, so the untraced statement is unchanged.
const insertTemplate = `
		INSERT INTO notifier_deliveries AS d (event_id, client_id, sensor_id, revision, payload, state%[1]s)
		SELECT e.event_id, s.client_id, e.sensor_id, e.revision, e.payload,
		       %[5]s%[2]s
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[], $5::text[]%[3]s) AS e(event_id, sensor_id, revision, payload, type%[4]s)
		-- The sensor's subscriptions by index, event by event: joined as a set, the whole
		-- subscriptions table was read for each batch.
		CROSS JOIN LATERAL (SELECT s.client_id, s.event_types FROM subscriptions s WHERE s.sensor_id = e.sensor_id OFFSET 0) s
		JOIN clients cl ON cl.id = s.client_id
		-- The event types the client and the subscription chose (empty: all).
		WHERE (cardinality(s.event_types) = 0 OR e.type = ANY(s.event_types))
		  AND (cardinality(cl.event_types) = 0 OR e.type = ANY(cl.event_types))
		ON CONFLICT (event_id, client_id, sensor_id) DO NOTHING
		RETURNING d.id, d.event_id, d.client_id, d.sensor_id, d.state, ` + sweepHint

// sweepHint says, for a row just inserted, whether another pending row of its key was
// attempted or is in flight (read with the INSERT's snapshot): a superset of the rows
// supersede acts on, the new row being newer than them. A key without one has nothing to
// sweep, and with a healthy receiver that is nearly every key, so the intake skips
// supersede's look-up for it; a row leased just after this snapshot is missed here as it
// would be by supersede's own snapshot, and the janitor's sweep of every key takes it.
const sweepHint = `EXISTS (SELECT 1 FROM notifier_deliveries o
		WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.id <> d.id
		  AND o.state = 'pending' AND (o.attempts > 0 OR o.lease_until >= now()) OFFSET 0)`

var (
	// insertState is the new row's enqueueState.
	insertState = enqueueStateSQL(`EXISTS (SELECT 1 FROM notifier_deliveries o
		            WHERE o.client_id = s.client_id AND o.sensor_id = e.sensor_id AND o.revision > e.revision)`)
	insertSQL       = fmt.Sprintf(insertTemplate, "", "", "", "", insertState)
	insertTracedSQL = fmt.Sprintf(insertTemplate, ", traceparent", ",\n\t\t       nullif(e.tp, '')", ", $6::text[]", ", tp", insertState)
)

// queueInsert queues the INSERT of insertDeliveries.
func queueInsert(b *pgx.Batch, evs []event.Event, payloads [][]byte, tps []string) {
	ids := make([]string, len(evs))
	sensors := make([]string, len(evs))
	revs := make([]int64, len(evs))
	types := make([]string, len(evs))
	for i, e := range evs {
		ids[i], sensors[i], revs[i], types[i] = e.ID, e.SensorID, e.Revision, "sensor."+e.Type
	}
	args := []any{ids, sensors, revs, payloads, types}
	q := insertSQL
	if tps != nil {
		q, args = insertTracedSQL, append(args, tps)
	}
	b.Queue(q, args...)
}

// readInsert reads the results of f's statements, the planner settings and queueInsert's.
func readInsert(br pgx.BatchResults, f fence) (ins inserted, recs []event.Attempt, err error) {
	if f.read != nil {
		if err := f.read(br); err != nil {
			return ins, nil, err
		}
	}
	if _, err := br.Exec(); err != nil {
		return ins, nil, fmt.Errorf("insert deliveries: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return ins, nil, fmt.Errorf("insert deliveries: %w", err)
	}
	defer rows.Close()
	now := time.Now()
	for rows.Next() {
		var id int64
		var evID, client, sensor, state string
		var sweep bool
		if err := rows.Scan(&id, &evID, &client, &sensor, &state, &sweep); err != nil {
			return ins, nil, fmt.Errorf("insert deliveries: %w", err)
		}
		ins.created++
		if sweep {
			ins.keyClients, ins.keySensors = append(ins.keyClients, client), append(ins.keySensors, sensor)
		}
		switch state {
		case StatePending:
			ins.ids, ins.clients, ins.sensors = append(ins.ids, id), append(ins.clients, client), append(ins.sensors, sensor)
		case StateSuperseded:
			recs = append(recs, event.Attempt{V: event.Version, EventID: evID, ClientID: client, SensorID: sensor,
				Attempt: 1, Time: now, Outcome: event.OutcomeSuperseded})
		}
	}
	if err := rows.Err(); err != nil {
		return ins, nil, fmt.Errorf("insert deliveries: %w", err)
	}
	return ins, recs, nil
}

// sweepCandidate selects, in SQL, the rows sweep may act on: pending, with a newer
// revision, attempted or in flight, and not flagged while in flight. The locked rows'
// facts then go to sweep itself (TestSupersedeSweepWiring holds the two together).
const sweepCandidate = `d.state = 'pending' AND (d.attempts > 0 OR d.lease_until >= now())
		  AND (NOT d.supersede_on_finish OR d.lease_until IS NULL OR d.lease_until < now())
		  AND ` + newerExists

// supersede applies sweep to the pending rows with a newer revision of the given (client,
// sensor) keys, or of every key when clients is nil: it supersedes those that already
// failed at least once (they wait for a retry) and flags those in flight, to be decided when
// their attempt ends (finishState). Flag and outcome are both UPDATEs of the row, so they
// serialise on its lock and whichever commits second sees the other.
func supersede(ctx context.Context, tx querier, clients, sensors []string) ([]event.Attempt, error) {
	q := `SELECT d.id, d.sensor_id FROM notifier_deliveries d WHERE ` + sweepCandidate
	var args []any
	if clients != nil {
		// Key by key, each an index probe of its sensor's partition (the LATERAL subquery
		// cannot be flattened): as a semi-join with the keys, planned as if pending rows
		// were few, every pending row was read and tested for each ingested batch.
		q = `SELECT x.id, x.sensor_id FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::text[])) AS k(client_id, sensor_id),
			LATERAL (SELECT d.id, d.sensor_id FROM notifier_deliveries d
			         WHERE d.client_id = k.client_id AND d.sensor_id = k.sensor_id AND ` + sweepCandidate + ` OFFSET 0) x`
		args = []any{clients, sensors}
	}
	ids, keys, err := collectIDs(ctx, tx, q, args...)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	ids, keys, now, err := lockSweep(ctx, tx, ids, keys)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	rows, err := tx.Query(ctx, `UPDATE notifier_deliveries d SET
			state = CASE WHEN d.id = ANY($3::bigint[]) THEN 'superseded' ELSE d.state END,
			supersede_on_finish = true, updated_at = now()
		WHERE `+byTID+`
		RETURNING d.event_id, d.client_id, d.sensor_id, d.attempts, d.state`, ids, keys, now)
	if err != nil {
		return nil, fmt.Errorf("supersede: %w", err)
	}
	defer rows.Close()
	var recs []event.Attempt
	at := time.Now()
	for rows.Next() {
		a := event.Attempt{V: event.Version, Time: at, Outcome: event.OutcomeSuperseded}
		var state string
		if err := rows.Scan(&a.EventID, &a.ClientID, &a.SensorID, &a.Attempt, &state); err != nil {
			return nil, fmt.Errorf("supersede: %w", err)
		}
		if state != StateSuperseded {
			continue // in flight: recorded when its attempt ends
		}
		a.Attempt++ // the attempt that will not be made
		recs = append(recs, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("supersede: %w", err)
	}
	return recs, nil
}

// lockSweep locks the candidate rows of ids (with their sensors) in id order, as finish
// locks its rows: updated in whatever order the scan met them, a supersede and a finish
// sharing two rows deadlocked under load. FOR UPDATE re-checks sweepCandidate on the newest
// version of each row it locks, and the rows stay locked, so sweep's verdicts on the facts
// read with the locks hold to the commit. It returns the rows to update and, of them, those
// superseded now. The UPDATE is a statement of its own, after the locks: its snapshot then
// sees the versions locked, which byTID needs (a TID scan skips a row updated after its
// snapshot instead of following it).
func lockSweep(ctx context.Context, tx querier, ids []int64, keys []string) (act []int64, actKeys []string, now []int64, err error) {
	rows, err := tx.Query(ctx, `SELECT x.id, x.sensor_id, x.attempts > 0, coalesce(x.lease_until >= now(), false), x.supersede_on_finish
		FROM `+byID+`, LATERAL (SELECT d.id, d.sensor_id, d.attempts, d.lease_until, d.supersede_on_finish
			FROM notifier_deliveries d
			WHERE d.id = k.id AND d.sensor_id = k.sensor_id AND `+sweepCandidate+` FOR UPDATE) x`, ids, keys)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("supersede: %w", err)
	}
	var id int64
	var key string
	f := rowFacts{newer: true} // a candidate has a newer revision
	_, err = pgx.ForEachRow(rows, []any{&id, &key, &f.attempted, &f.inFlight, &f.flagged}, func() error {
		switch sweep(f) {
		case sweepSupersede:
			now = append(now, id)
		case sweepKeep:
			return nil
		}
		act, actKeys = append(act, id), append(actKeys, key)
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("supersede: %w", err)
	}
	return act, actKeys, now, nil
}

// writeOutbox queues attempt records in tx for the relay to DELIVERIES.
func writeOutbox(ctx context.Context, tx pgx.Tx, recs []event.Attempt) error {
	b := &pgx.Batch{}
	if err := queueOutbox(b, recs); err != nil || b.Len() == 0 {
		return err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write attempt outbox: %w", err)
	}
	return nil
}

// queueOutbox queues writeOutbox's INSERT, when there are records.
func queueOutbox(b *pgx.Batch, recs []event.Attempt) error {
	if len(recs) == 0 {
		return nil
	}
	clients := make([]string, len(recs))
	msgIDs := make([]string, len(recs))
	payloads := make([][]byte, len(recs))
	for i, a := range recs {
		p, err := json.Marshal(a)
		if err != nil {
			return fmt.Errorf("encode attempt: %w", err)
		}
		clients[i], msgIDs[i], payloads[i] = a.ClientID, event.AttemptMsgID(a), p
	}
	b.Queue(`INSERT INTO notifier_attempt_outbox (client_id, msg_id, payload)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, clients, msgIDs, payloads)
	return nil
}
