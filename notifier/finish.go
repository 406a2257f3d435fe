package notifier

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

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
// alone. The row's state is finishState's, planned per attempt (planFinish) and completed
// by the UPDATE with the row's flag and newer revisions. The endpoints' health is recorded
// with them, and a client failing for disableAfter or longer at now is disabled
// (disableVerdict), in the round trip of the outbox.
func finish(ctx context.Context, db pgtx.Pool, rs []result, disableAfter time.Duration, now time.Time) (finished, error) {
	// Rows in id order, so that two finishing batches lock them in the same order.
	rs = slices.SortedFunc(slices.Values(rs), func(a, b result) int { return cmp.Compare(a.c.id, b.c.id) })
	resultOf := map[int64]result{}
	var a outcomeArgs
	for _, r := range rs {
		resultOf[r.c.id] = r
		a.add(r)
	}
	var recs []event.Attempt
	var disabled map[string]string
	var claimable bool
	// BEGIN goes with the first batch and COMMIT with the outcomes' (writeOutcomes).
	err := pgtx.Run(ctx, db, func(tx *pgtx.Tx) error {
		// One round trip for the lock, the outcomes and the endpoints' health (the outbox
		// rows need the outcomes). Rows are locked in id order before the update (see supersede).
		// Each row is looked up by its id and sensor (the partition key): by id alone, every
		// partition is searched.
		b := &pgx.Batch{}
		queueFinish(b, a)
		hs := healthOf(rs)
		if len(hs) > 0 {
			queueHealth(b, hs)
		}
		var fins []fin
		var since map[string]*time.Time
		if err := tx.Send(ctx, b, func(br pgx.BatchResults) error {
			var err error
			fins, since, err = readFinish(br, len(hs) > 0)
			return err
		}); err != nil {
			return err
		}
		recs, claimable = recordsOf(fins, resultOf)
		var err error
		disabled, err = writeOutcomes(ctx, tx, recs, toDisable(hs, since, disableAfter, now))
		return err
	})
	if err != nil {
		return finished{}, fmt.Errorf("finish attempts: %w", err)
	}
	return finished{recs: recs, disabled: disabled, claimable: claimable}, nil
}

// queueFinish queues finish's statements for the rows of a, between the settings they run
// under (read by readFinish, the health statements after them).
func queueFinish(b *pgx.Batch, a outcomeArgs) {
	// Nested loops off for the update (JIT for the rest of the transaction): it joins its rows with
	// the outcomes by id, and a plan kept for the statement (generic, taking the
	// outcomes for 10 rows) compared every row with every outcome, quadratic in the
	// batch. The LATERAL probes have no other plan and keep theirs. JIT off with it: the
	// probes' plans then cost more than jit_above_cost, and compiling one took seconds.
	// Generic plans and no sequential scans for the lock and the update, as in claim.
	b.Queue(`SELECT set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true),
		set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`)
	b.Queue(`SELECT 1 FROM `+byID+`, LATERAL (SELECT 1 FROM notifier_deliveries d
		WHERE d.id = k.id AND d.sensor_id = k.sensor_id FOR UPDATE) x`, a.ids, a.sensors)
	b.Queue(`
		UPDATE notifier_deliveries d SET
			state = `+finishStateSQL+`,
			attempts = d.attempts + CASE WHEN r.counted THEN 1 ELSE 0 END,
			next_at = CASE WHEN r.counted AND r.state = 'pending' THEN now() + r.delay * interval '1 microsecond' ELSE d.next_at END,
			last_status = CASE WHEN r.counted THEN nullif(r.status, 0) ELSE d.last_status END,
			last_error = CASE WHEN r.counted THEN nullif(r.err, '') ELSE d.last_error END,
			failed_attempts = d.failed_attempts + CASE WHEN r.counted AND r.state IN ('pending', 'dead') THEN 1 ELSE 0 END,
			last_latency_ms = CASE WHEN r.counted AND r.state <> 'cancelled' THEN r.latency ELSE d.last_latency_ms END,
			lease_until = NULL, lease_token = NULL, updated_at = now()
		FROM unnest($1::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::int[], $7::text[], $8::bool[], $9::bigint[],
		            $10::text[], $11::text[], $12::text[])
		     AS r(id, token, state, delay, status, err, counted, latency, if_flagged, if_newer, otherwise)
		WHERE `+byTID+` AND d.id = r.id AND d.lease_token = r.token AND `+pendingTarget+`
		RETURNING d.id, d.state, d.attempts, EXISTS (SELECT 1 FROM notifier_deliveries o
			WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.id <> d.id AND o.state = 'pending' OFFSET 0)`, a.ids, a.sensors, a.tokens, a.states, a.delays, a.statuses, a.errs, a.counted,
		a.latencies, a.ifFlagged, a.ifNewer, a.otherwise)
	// The planner's own choices again for the health statements.
	b.Queue(`SELECT set_config('enable_nestloop', 'on', true), set_config('plan_cache_mode', 'auto', true),
		set_config('enable_seqscan', 'on', true)`)
}

// recordsOf is the attempt records of the rows finished (none for an aborted attempt), and
// whether a row may be claimable after them (finished.claimable).
func recordsOf(fins []fin, resultOf map[int64]result) (recs []event.Attempt, claimable bool) {
	for _, f := range fins {
		claimable = claimable || f.state == StatePending || f.others
		r := resultOf[f.id]
		if r.aborted {
			continue
		}
		recs = append(recs, event.Attempt{V: event.Version, EventID: r.c.eventID, ClientID: r.c.clientID,
			SensorID: r.c.sensorID, Attempt: f.attempts, Time: r.at.UTC(), StatusCode: r.status,
			LatencyMS: r.latency.Milliseconds(), Error: r.errText, Outcome: outcomeOf(f.state)})
	}
	return recs, claimable
}

// finished is what finish wrote: the attempt records, the clients disabled (with their
// reasons), and whether a row may be claimable because of it: one still pending (a retry,
// a lease given back) or another pending row of a finished row's key (a newer revision it
// held back).
type finished struct {
	recs      []event.Attempt
	disabled  map[string]string
	claimable bool
}

// outcomeArgs are finish's results as the arrays of its UPDATE, one element per result.
type outcomeArgs struct {
	ids, tokens, delays, latencies []int64
	states, errs, sensors          []string
	ifFlagged, ifNewer, otherwise  []string // the result's finishPlan
	statuses                       []int32
	counted                        []bool
}

func (a *outcomeArgs) add(r result) {
	a.ids, a.tokens, a.sensors = append(a.ids, r.c.id), append(a.tokens, r.c.token), append(a.sensors, r.c.sensorID)
	a.states, a.delays = append(a.states, r.state), append(a.delays, r.delay.Microseconds())
	a.statuses, a.errs = append(a.statuses, int32(r.status)), append(a.errs, r.errText)
	a.counted = append(a.counted, !r.aborted)
	a.latencies = append(a.latencies, r.latency.Milliseconds())
	p := planFinish(r.c.attempts > 0, !r.aborted, r.state)
	a.ifFlagged, a.ifNewer, a.otherwise = append(a.ifFlagged, p.ifFlagged), append(a.ifNewer, p.ifNewer), append(a.otherwise, p.otherwise)
}

// fin is a row's state and attempts after finish's update.
type fin struct {
	id       int64
	state    string
	attempts int
	others   bool // another row of its key is pending
}

// readFinish reads the results of finish's batch: the settings, the lock, the update, and
// the health when queued.
func readFinish(br pgx.BatchResults, health bool) (fins []fin, since map[string]*time.Time, err error) {
	for range 2 { // the setting, the lock
		if _, err = br.Exec(); err != nil {
			return nil, nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	fins, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (fin, error) {
		var f fin
		err := r.Scan(&f.id, &f.state, &f.attempts, &f.others)
		return f, err
	})
	if err != nil {
		return nil, nil, err
	}
	if _, err = br.Exec(); err != nil { // nested loops on
		return nil, nil, err
	}
	if !health {
		return fins, nil, nil
	}
	since, err = readHealth(br)
	return fins, since, err
}

// writeOutcomes writes, in one round trip of tx, the attempt records recs in the outbox and
// the disabling of the clients ds; it returns the clients disabled, with their reasons.
func writeOutcomes(ctx context.Context, tx *pgtx.Tx, recs []event.Attempt, ds []disabling) (disabled map[string]string, err error) {
	b := &pgx.Batch{}
	if err := queueOutbox(b, recs); err != nil {
		return nil, err
	}
	outbox := b.Len() > 0
	if len(ds) > 0 {
		queueDisable(b, ds)
	}
	err = tx.Commit(ctx, b, func(br pgx.BatchResults) error {
		if outbox {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("write attempt outbox: %w", err)
			}
		}
		if len(ds) == 0 {
			return nil
		}
		var err error
		disabled, err = readDisabled(br)
		return err
	})
	return disabled, err
}
