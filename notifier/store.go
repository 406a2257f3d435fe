package notifier

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lock-sensors/lock-sensors/internal/event"
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

// newerExists is true for a row d when a row of a higher revision exists for the same
// (client, sensor), in any state: from then on d must never be sent.
const newerExists = `EXISTS (SELECT 1 FROM notifier_deliveries o
	WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.revision > d.revision OFFSET 0)`

// insertDeliveries creates one delivery per (event, subscribed client) in tx, idempotently by
// (event_id, client_id), and supersedes the older rows of the keys it touched. It returns the
// attempt records of what was superseded, for the outbox.
func insertDeliveries(ctx context.Context, tx pgx.Tx, evs []event.Event, payloads [][]byte) (created int, recs []event.Attempt, err error) {
	ids := make([]string, len(evs))
	sensors := make([]string, len(evs))
	revs := make([]int64, len(evs))
	for i, e := range evs {
		ids[i], sensors[i], revs[i] = e.ID, e.SensorID, e.Revision
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO notifier_deliveries AS d (event_id, client_id, sensor_id, revision, payload, state)
		SELECT e.event_id, s.client_id, e.sensor_id, e.revision, e.payload,
		       CASE WHEN EXISTS (SELECT 1 FROM notifier_deliveries o
		            WHERE o.client_id = s.client_id AND o.sensor_id = e.sensor_id AND o.revision > e.revision)
		            THEN 'superseded' ELSE 'pending' END
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS e(event_id, sensor_id, revision, payload)
		JOIN subscriptions s ON s.sensor_id = e.sensor_id
		ON CONFLICT (event_id, client_id) DO NOTHING
		RETURNING d.event_id, d.client_id, d.sensor_id, d.state`, ids, sensors, revs, payloads)
	if err != nil {
		return 0, nil, fmt.Errorf("insert deliveries: %w", err)
	}
	var keyC, keyS []string
	now := time.Now()
	for rows.Next() {
		var evID, client, sensor, state string
		if err := rows.Scan(&evID, &client, &sensor, &state); err != nil {
			rows.Close()
			return 0, nil, fmt.Errorf("insert deliveries: %w", err)
		}
		created++
		keyC, keyS = append(keyC, client), append(keyS, sensor)
		if state == StateSuperseded {
			recs = append(recs, event.Attempt{V: event.Version, EventID: evID, ClientID: client, SensorID: sensor,
				Attempt: 1, Time: now, Outcome: event.OutcomeSuperseded})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("insert deliveries: %w", err)
	}
	if len(keyC) == 0 {
		return 0, recs, nil
	}
	more, err := supersede(ctx, tx, keyC, keyS)
	return created, append(recs, more...), err
}

// supersede marks as superseded the pending rows that already failed at least once (they
// wait for a retry) or whose attempt is in flight (flagged: superseded if it fails), and
// have a newer revision, restricted to
// the given (client, sensor) keys, or everywhere when clients is nil. A row whose attempt is
// in flight is flagged instead, and superseded when its attempt ends unless delivered. The
// flag is set by an UPDATE of the row, so it serialises with the finishing UPDATE on the
// row lock (re-checked on the newest row version): whichever commits second sees the other.
func supersede(ctx context.Context, tx pgx.Tx, clients, sensors []string) ([]event.Attempt, error) {
	// The rows are locked in id order first, as finish locks its rows: updated in whatever
	// order the scan met them, a supersede and a finish sharing two rows deadlocked under load
	// (Postgres broke it after deadlock_timeout, and the finish was retried). FOR UPDATE
	// re-checks cond on the newest version of each row it locks, and the rows stay locked, so
	// the UPDATE need not check it again.
	cond := `d.state = 'pending' AND (d.attempts > 0 OR d.lease_until >= now())
		  AND (NOT d.supersede_on_finish OR d.lease_until IS NULL OR d.lease_until < now())
		  AND ` + newerExists
	args := []any{}
	if clients != nil {
		cond += ` AND (d.client_id, d.sensor_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`
		args = append(args, clients, sensors)
	}
	q := `WITH l AS (SELECT d.id FROM notifier_deliveries d WHERE ` + cond + ` ORDER BY d.id FOR UPDATE)
		UPDATE notifier_deliveries d SET
			state = CASE WHEN d.lease_until IS NULL OR d.lease_until < now() THEN 'superseded' ELSE d.state END,
			supersede_on_finish = true, updated_at = now()
		FROM l WHERE d.id = l.id
		RETURNING d.event_id, d.client_id, d.sensor_id, d.attempts, d.state`
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("supersede: %w", err)
	}
	defer rows.Close()
	var recs []event.Attempt
	now := time.Now()
	for rows.Next() {
		a := event.Attempt{V: event.Version, Time: now, Outcome: event.OutcomeSuperseded}
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

// writeOutbox queues attempt records in tx for the relay to DELIVERIES.
func writeOutbox(ctx context.Context, tx pgx.Tx, recs []event.Attempt) error {
	if len(recs) == 0 {
		return nil
	}
	clients := make([]string, len(recs))
	msgIDs := make([]string, len(recs))
	payloads := make([][]byte, len(recs))
	for i, a := range recs {
		b, err := json.Marshal(a)
		if err != nil {
			return fmt.Errorf("encode attempt: %w", err)
		}
		clients[i], msgIDs[i], payloads[i] = a.ClientID, event.AttemptMsgID(a), b
	}
	_, err := tx.Exec(ctx, `INSERT INTO notifier_attempt_outbox (client_id, msg_id, payload)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, clients, msgIDs, payloads)
	if err != nil {
		return fmt.Errorf("write attempt outbox: %w", err)
	}
	return nil
}

// claimed is a delivery leased for one attempt, with the registry read afresh.
type claimed struct {
	id          int64
	token       int64
	eventID     string
	clientID    string
	sensorID    string
	revision    int64
	payload     []byte
	attempts    int
	attemptBase int
	// From the registry at claim time; url is empty when the client no longer exists.
	url           string
	secret        string
	previous      string
	previousUntil time.Time
	address       string
	subscribed    bool
}

// claimable is a due, unleased, pending row; unblocked adds that no pending row of a lower
// revision exists for its (client, sensor) and no other row of the key is in flight: per
// key, one attempt at a time, in revision order. A healthy receiver thus gets every
// revision; only rows that already failed are superseded by newer ones (see supersede).
const (
	claimable = `d.state = 'pending' AND d.next_at <= now() AND (d.lease_until IS NULL OR d.lease_until < now())`
	// OFFSET 0 keeps this a per-row index probe: as an anti-join the planner would hash the
	// whole table for every claim.
	unblocked = `NOT EXISTS (SELECT 1 FROM notifier_deliveries o
		WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.id <> d.id
		  AND o.state = 'pending' AND (o.revision < d.revision OR o.lease_until >= now()) OFFSET 0)`
	eligible = claimable + ` AND ` + unblocked
)

// capacity says which clients can take how many attempts: busy ones none, those in free
// the given number, every other one perClient.
type capacity struct {
	busy       []string
	freeClient []string
	free       []int32
	perClient  int
}

// claim leases up to limit eligible rows, within each client's capacity, earliest due
// first. It looks at the window of the earliest 4×limit due and unblocked rows only (rows
// waiting for a lower revision of their key are skipped while the window fills), so that a
// large backlog does not make every claim scan it. It is two statements in one transaction: the
// first picks candidates and takes a transaction-scoped advisory lock per (client, sensor)
// (pg_try_advisory_xact_lock: a key another claimer holds is skipped, not waited for — the
// SKIP LOCKED of keys); the second leases them, re-checking eligibility with a snapshot
// taken after those locks, so two notifier processes can never both lease one row nor put
// two revisions of one key in flight (the second would see the first's committed lease).
// A concurrent writer of the row (ingest superseding it) is waited for and re-checked by
// the UPDATE itself.
func claim(ctx context.Context, db DB, c capacity, limit int, token int64, lease time.Duration) ([]claimed, error) {
	var out []claimed
	// A nil slice is SQL NULL, and x = ANY(NULL) is never false.
	busy, fc, fr := c.busy, c.freeClient, c.free
	if busy == nil {
		busy = []string{}
	}
	if fc == nil {
		fc, fr = []string{}, []int32{}
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT id FROM (
				SELECT id, client_id, sensor_id FROM (
					SELECT d.id, d.client_id, d.sensor_id, d.revision, d.next_at, coalesce(f.free, $2) AS free,
					       row_number() OVER (PARTITION BY d.client_id ORDER BY d.next_at, d.id) AS rn
					FROM (SELECT * FROM notifier_deliveries d
					      WHERE `+claimable+` AND NOT (d.client_id = ANY($1::text[])) AND `+unblocked+`
					      ORDER BY d.next_at, d.id LIMIT $4) d
					LEFT JOIN unnest($5::text[], $6::int[]) AS f(client_id, free) ON f.client_id = d.client_id
				) d
				WHERE rn <= free
				ORDER BY next_at, id LIMIT $3
			) x
			WHERE pg_try_advisory_xact_lock(hashtextextended(client_id || '/' || sensor_id, 7301))`,
			busy, c.perClient, limit, 4*limit, fc, fr)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(ids) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, `
			WITH c AS (
				UPDATE notifier_deliveries d SET lease_until = now() + $2 * interval '1 microsecond', lease_token = $3
				WHERE d.id = ANY($1::bigint[]) AND `+eligible+`
				RETURNING d.id, d.event_id, d.client_id, d.sensor_id, d.revision, d.payload, d.attempts, d.attempt_base
			)
			SELECT c.id, c.event_id, c.client_id, c.sensor_id, c.revision, c.payload, c.attempts, c.attempt_base,
			       coalesce(cl.webhook_url, ''), coalesce(cl.signing_secret, ''), coalesce(cl.previous_secret, ''),
			       coalesce(cl.previous_secret_until, 'epoch'::timestamptz), coalesce(s.address, ''),
			       sub.client_id IS NOT NULL
			FROM c
			LEFT JOIN clients cl ON cl.id = c.client_id
			LEFT JOIN sensors s ON s.id = c.sensor_id
			LEFT JOIN subscriptions sub ON sub.client_id = c.client_id AND sub.sensor_id = c.sensor_id`,
			ids, lease.Microseconds(), token)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			c := claimed{token: token}
			if err := rows.Scan(&c.id, &c.eventID, &c.clientID, &c.sensorID, &c.revision, &c.payload, &c.attempts,
				&c.attemptBase, &c.url, &c.secret, &c.previous, &c.previousUntil, &c.address, &c.subscribed); err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// unlease gives back rows claimed but not attempted (no slot, or shutting down).
func unlease(ctx context.Context, db DB, cs []claimed) error {
	if len(cs) == 0 {
		return nil
	}
	ids := make([]int64, len(cs))
	tokens := make([]int64, len(cs))
	for i, c := range cs {
		ids[i], tokens[i] = c.id, c.token
	}
	_, err := db.Exec(ctx, `UPDATE notifier_deliveries d SET lease_until = NULL, lease_token = NULL
		FROM unnest($1::bigint[], $2::bigint[]) AS r(id, token)
		WHERE d.id = r.id AND d.lease_token = r.token AND d.state = 'pending'`, ids, tokens)
	if err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// result is the end of one attempt, to be written by finish.
type result struct {
	c       claimed
	aborted bool          // not an attempt (shutdown): release the lease only
	state   string        // pending (retry), delivered, dead, cancelled
	delay   time.Duration // before the next attempt, when state is pending
	status  int
	errText string
	at      time.Time
	latency time.Duration
	// retryAfter is the response's Retry-After header, if any.
	retryAfter string
}

// finish writes the outcomes of attempts in one transaction, with their attempt records in
// the outbox. A row whose lease was lost (another process took it over after expiry) is left
// alone. A failed attempt of a row that now has a newer revision is superseded instead of
// retried. It returns the records written.
func finish(ctx context.Context, db DB, rs []result) ([]event.Attempt, error) {
	var (
		ids, tokens, delays []int64
		states, errs        []string
		statuses            []int32
		counted             []bool
	)
	// Rows in id order, so that two finishing batches lock them in the same order.
	rs = slices.SortedFunc(slices.Values(rs), func(a, b result) int { return cmp.Compare(a.c.id, b.c.id) })
	byID := map[int64]result{}
	for _, r := range rs {
		byID[r.c.id] = r
		ids, tokens = append(ids, r.c.id), append(tokens, r.c.token)
		states, delays = append(states, r.state), append(delays, r.delay.Microseconds())
		statuses, errs = append(statuses, int32(r.status)), append(errs, r.errText)
		counted = append(counted, !r.aborted)
	}
	var recs []event.Attempt
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		recs = recs[:0]
		// Locked in id order before the update (see supersede).
		if _, err := tx.Exec(ctx, `SELECT 1 FROM notifier_deliveries WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE`, ids); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			UPDATE notifier_deliveries d SET
				state = CASE WHEN (NOT r.counted OR r.state = 'pending') AND d.supersede_on_finish THEN 'superseded'
				             WHEN NOT r.counted THEN d.state
				             WHEN r.state = 'pending' AND `+newerExists+` THEN 'superseded'
				             ELSE r.state END,
				attempts = d.attempts + CASE WHEN r.counted THEN 1 ELSE 0 END,
				next_at = CASE WHEN r.counted AND r.state = 'pending' THEN now() + r.delay * interval '1 microsecond' ELSE d.next_at END,
				last_status = CASE WHEN r.counted THEN nullif(r.status, 0) ELSE d.last_status END,
				last_error = CASE WHEN r.counted THEN nullif(r.err, '') ELSE d.last_error END,
				lease_until = NULL, lease_token = NULL, updated_at = now()
			FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::int[], $6::text[], $7::bool[])
			     AS r(id, token, state, delay, status, err, counted)
			WHERE d.id = r.id AND d.lease_token = r.token AND d.state = 'pending'
			RETURNING d.id, d.state, d.attempts`, ids, tokens, states, delays, statuses, errs, counted)
		if err != nil {
			return err
		}
		type fin struct {
			id       int64
			state    string
			attempts int
		}
		fins, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fin, error) {
			var f fin
			err := r.Scan(&f.id, &f.state, &f.attempts)
			return f, err
		})
		if err != nil {
			return err
		}
		for _, f := range fins {
			r := byID[f.id]
			if r.aborted {
				continue
			}
			recs = append(recs, event.Attempt{V: event.Version, EventID: r.c.eventID, ClientID: r.c.clientID,
				SensorID: r.c.sensorID, Attempt: f.attempts, Time: r.at.UTC(), StatusCode: r.status,
				LatencyMS: r.latency.Milliseconds(), Error: r.errText, Outcome: outcomeOf(f.state)})
		}
		return writeOutbox(ctx, tx, recs)
	})
	if err != nil {
		return nil, fmt.Errorf("finish attempts: %w", err)
	}
	return recs, nil
}

// outboxRow is one attempt record waiting for the relay.
type outboxRow struct {
	id       int64
	clientID string
	msgID    string
	payload  []byte
}

// nextDue is how long until the earliest pending row not yet due, or max when none is.
func nextDue(ctx context.Context, db DB, ceiling time.Duration) time.Duration {
	var us *int64
	err := db.QueryRow(ctx, `SELECT (extract(epoch FROM min(next_at) - now()) * 1e6)::bigint
		FROM notifier_deliveries WHERE state = 'pending' AND next_at > now()`).Scan(&us)
	if err != nil || us == nil {
		return ceiling
	}
	return min(ceiling, time.Duration(*us)*time.Microsecond)
}

// DeadDelivery is a dead-lettered delivery: every attempt failed.
type DeadDelivery struct {
	ID         int64
	EventID    string
	ClientID   string
	SensorID   string
	Revision   int64
	Attempts   int
	LastStatus int
	LastError  string
	CreatedAt  time.Time
	DeadAt     time.Time
	Event      event.Event
}

// ListDead lists a client's dead deliveries, oldest dead first, after the one with id
// afterID (0 for the first page), at most limit (1 to 1000).
func ListDead(ctx context.Context, db DB, clientID string, afterID int64, limit int) ([]DeadDelivery, error) {
	if limit < 1 || limit > 1000 {
		limit = 100
	}
	rows, err := db.Query(ctx, `SELECT id, event_id, client_id, sensor_id, revision, attempts,
			coalesce(last_status, 0), coalesce(last_error, ''), created_at, updated_at, payload
		FROM notifier_deliveries WHERE client_id = $1 AND state = 'dead' AND id > $2
		ORDER BY id LIMIT $3`, clientID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list dead deliveries: %w", err)
	}
	defer rows.Close()
	var out []DeadDelivery
	for rows.Next() {
		var d DeadDelivery
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
func Redrive(ctx context.Context, db DB, clientID string, from, to time.Time) (int64, error) {
	var f, t *time.Time
	if !from.IsZero() {
		f = &from
	}
	if !to.IsZero() {
		t = &to
	}
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `
			WITH dead AS (
				SELECT id FROM notifier_deliveries
				WHERE client_id = $1 AND state = 'dead'
				  AND ($2::timestamptz IS NULL OR updated_at >= $2) AND ($3::timestamptz IS NULL OR updated_at < $3)
				FOR UPDATE
			), u AS (
				UPDATE notifier_deliveries d SET
					state = CASE WHEN `+newerExists+` THEN 'superseded' ELSE 'pending' END,
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
