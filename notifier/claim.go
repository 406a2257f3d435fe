package notifier

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lock-sensors/lock-sensors/internal/pgtx"
)

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
	// traceparent is the event's (its reading's) trace context, when it was traced.
	traceparent string
	// due is when the row became due (its next_at): a first attempt's is its delivery's commit.
	due time.Time
	// leasedAt is this process's time just before the claim: the lease ends after it.
	leasedAt time.Time
	// From the registry at claim time; url is empty when the client no longer exists.
	url        string
	secrets    Secrets
	address    string
	subscribed bool
}

// claimable is a due, unleased, pending row; unblocked adds that no pending row of a lower
// revision exists for its (client, sensor) and no other row of the key is in flight: per
// key, one attempt at a time, in revision order. A healthy receiver thus gets every
// revision; only rows that already failed are superseded by newer ones (see supersede).
const (
	claimable = `d.state = 'pending' AND ` + dueFree
	dueFree   = `d.next_at <= now() AND (d.lease_until IS NULL OR d.lease_until < now()) AND ` + notDisabled
	// OFFSET 0 keeps this a per-row index probe: as an anti-join the planner would hash the
	// whole table for every claim.
	unblocked = `NOT EXISTS (SELECT 1 FROM notifier_deliveries o
		WHERE o.client_id = d.client_id AND o.sensor_id = d.sensor_id AND o.id <> d.id
		  AND o.state = 'pending' AND (o.revision < d.revision OR o.lease_until >= now()) OFFSET 0)`
	// eligibleTarget is the rest of eligible (after pendingTarget) for the target of the
	// UPDATE that leases rows by byTID.
	eligibleTarget = dueFree + ` AND ` + unblocked
)

// rankedWindow is the claim's window: the earliest due, unblocked rows of clients not busy,
// as many as the parameter named by limit, each numbered within its client (rn) beside the
// number its client may take (free). The claim reads the window of its limit ($3) first: when
// no client in it is over its number, the first $3 rows of the wide window ($4, 4×) would be
// those very rows, and the wide one, which the claim reads only otherwise, would have tested
// three times as many rows for nothing (OneClient: three quarters of the claim's reads).
func rankedWindow(limit string) string {
	return `SELECT d.id, d.client_id, d.sensor_id, d.next_at, coalesce(f.free, $2) AS free,
		       row_number() OVER (PARTITION BY d.client_id ORDER BY d.next_at, d.id) AS rn
		FROM (SELECT * FROM notifier_deliveries d
		      WHERE ` + claimable + ` AND NOT (d.client_id = ANY($1::text[])) AND ` + unblocked + `
		      ORDER BY d.next_at, d.id LIMIT ` + limit + `) d
		LEFT JOIN unnest($5::text[], $6::int[]) AS f(client_id, free) ON f.client_id = d.client_id`
}

// capacity says which clients can take how many attempts: busy ones none, those in free
// the given number, every other one perClient.
type capacity struct {
	busy       []string
	freeClient []string
	free       []int32
	perClient  int
}

// heldBack reports whether a claim under c that leased cs may have left due rows behind
// for want of an endpoint's room: a client was busy, or took all it could.
func (c capacity) heldBack(cs []claimed) bool {
	if len(c.busy) > 0 {
		return true
	}
	took := map[string]int{}
	for _, x := range cs {
		took[x.clientID]++
	}
	room := c.rooms()
	for client, k := range took {
		if k >= room(client) {
			return true
		}
	}
	return false
}

// rooms returns how many attempts a client may take under c.
func (c capacity) rooms() func(client string) int {
	free := make(map[string]int, len(c.busy)+len(c.freeClient))
	for _, b := range c.busy {
		free[b] = 0
	}
	for j, f := range c.freeClient {
		free[f] = int(c.free[j])
	}
	return func(client string) int {
		if n, ok := free[client]; ok {
			return n
		}
		return c.perClient
	}
}

// claim leases up to limit eligible rows, within each client's capacity, earliest due
// first. It looks at the window of the earliest 4×limit due and unblocked rows only (rows
// waiting for a lower revision of their key are skipped while the window fills), so that a
// large backlog does not make every claim scan it, and at the first limit of them only when
// no client there is over its number (rankedWindow). It is two statements in one transaction: the
// first picks candidates and takes a transaction-scoped advisory lock per (client, sensor)
// (pg_try_advisory_xact_lock: a key another claimer holds is skipped, not waited for — the
// SKIP LOCKED of keys); the second leases them, re-checking eligibility with a snapshot
// taken after those locks, so two notifier processes can never both lease one row nor put
// two revisions of one key in flight (the second would see the first's committed lease).
// A concurrent writer of the row (ingest superseding it) is waited for and re-checked by
// the UPDATE itself.
//
// Once begun, it is seen through (seeThrough) even when ctx ends; the caller gives back what
// it cannot attempt.
func claim(ctx context.Context, db pgtx.Pool, c capacity, limit int, token int64, lease time.Duration) ([]claimed, error) {
	var out []claimed
	ctx, cancel, err := seeThrough(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	leasedAt := time.Now()
	err = pgtx.Run(ctx, db, func(tx *pgtx.Tx) error {
		b := &pgx.Batch{}
		queueCandidates(b, c, limit)
		var ids []int64
		var sensors []string
		err := tx.Send(ctx, b, func(br pgx.BatchResults) error {
			var err error
			ids, sensors, err = readCandidates(br)
			return err
		})
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return tx.Commit(ctx, nil, nil)
		}
		w := &pgx.Batch{}
		queueLease(w, ids, sensors, lease, token)
		return tx.Commit(ctx, w, func(br pgx.BatchResults) error {
			out, err = readLease(br, token, leasedAt)
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return out, nil
}

// queueCandidates queues claim's first statement, which picks up to limit candidates within
// c and takes their keys' advisory locks, between the settings it runs under (read by
// readCandidates).
func queueCandidates(b *pgx.Batch, c capacity, limit int) {
	// A nil slice is SQL NULL, and x = ANY(NULL) is never false.
	busy, fc, fr := c.busy, c.freeClient, c.free
	if busy == nil {
		busy = []string{}
	}
	if fc == nil {
		fc, fr = []string{}, []int32{}
	}
	// JIT off, in the same round trip: the planner's estimate for this statement (a subplan
	// per row on every partition) passes jit_above_cost, and compiling it cost far more
	// than the query, which runs in milliseconds.
	// Sorts off: the window must be read in the due index's order (a merge of the
	// partitions' scans), so that the unblocked test runs on the rows up to the window's
	// end only. Estimating the pending rows few (without statistics, or with ones from
	// before a backlog), the planner tested every pending row and sorted them instead, so
	// that each claim grew with the backlog (several times the buffers read per claim).
	// The sorts above the window have no alternative and stay.
	// Generic plans: the statements' shapes no longer depend on the table's contents,
	// and planning them afresh for each claim, which the planner chose, about doubled
	// BenchmarkLatency's median. Sequential scans off for
	// the UPDATE: its generic plan, made once per connection and kept, scanned whole the
	// partitions that were nearly empty when it was made (seen), instead of by TID.
	// The commit does not wait for its WAL flush (synchronous_commit off): a lease lost
	// with a Postgres crash only makes its row claimable again, which a crash between an
	// attempt and its recorded outcome does anyway (at least once), and the flush is one
	// more wait on every webhook's way.
	b.Queue(`SELECT set_config('jit', 'off', true), set_config('enable_sort', 'off', true),
		set_config('plan_cache_mode', 'force_generic_plan', true), set_config('synchronous_commit', 'off', true)`)
	b.Queue(`
		WITH narrow AS MATERIALIZED (`+rankedWindow("$3")+`),
		     wide AS MATERIALIZED (`+rankedWindow("$4")+`)
		SELECT id, sensor_id FROM (
			SELECT id, client_id, sensor_id FROM (
				SELECT * FROM narrow WHERE NOT EXISTS (SELECT 1 FROM narrow WHERE rn > free)
				UNION ALL
				SELECT * FROM wide WHERE EXISTS (SELECT 1 FROM narrow WHERE rn > free)
			) d
			WHERE rn <= free
			ORDER BY next_at, id LIMIT $3
		) x
		WHERE pg_try_advisory_xact_lock(hashtextextended(client_id || '/' || sensor_id, 7301))`,
		busy, c.perClient, limit, 4*limit, fc, fr)
	b.Queue(`SELECT set_config('enable_seqscan', 'off', true)`)
}

// readCandidates reads what queueCandidates queued: the candidates' ids and sensors.
func readCandidates(br pgx.BatchResults) (ids []int64, sensors []string, err error) {
	if _, err := br.Exec(); err != nil {
		return nil, nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	var id int64
	var sensor string
	if _, err := pgx.ForEachRow(rows, []any{&id, &sensor}, func() error {
		ids, sensors = append(ids, id), append(sensors, sensor)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	_, err = br.Exec() // sequential scans off, for the UPDATE
	return ids, sensors, err
}

// unlease gives back rows claimed but not attempted (no slot, or shutting down).
func unlease(ctx context.Context, db DB, cs []claimed) error {
	if len(cs) == 0 {
		return nil
	}
	ids := make([]int64, len(cs))
	tokens := make([]int64, len(cs))
	sensors := make([]string, len(cs))
	for i, c := range cs {
		ids[i], tokens[i], sensors[i] = c.id, c.token, c.sensorID
	}
	// By id and sensor (the partition key), not by TID: a TID scan would skip a row updated
	// since its snapshot (flagged by a supersede), and its lease would then run out instead.
	_, err := db.Exec(ctx, `UPDATE notifier_deliveries d SET lease_until = NULL, lease_token = NULL
		FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS r(id, sensor_id, token)
		WHERE d.id = r.id AND d.sensor_id = r.sensor_id AND d.lease_token = r.token AND d.state = 'pending'`, ids, sensors, tokens)
	if err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
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

// queueLease queues claim's UPDATE that leases the rows of ids (with their sensors, for
// partition pruning) that are still eligible, re-checked by the UPDATE itself, and reads
// their clients' registry entries; readLease reads it. Sequential scans must be off.
func queueLease(b *pgx.Batch, ids []int64, sensors []string, lease time.Duration, token int64) {
	b.Queue(`
		WITH c AS (
			UPDATE notifier_deliveries d SET lease_until = now() + $3 * interval '1 microsecond', lease_token = $4
			WHERE `+byTID+` AND `+pendingTarget+` AND `+eligibleTarget+`
			RETURNING d.id, d.event_id, d.client_id, d.sensor_id, d.revision, d.payload, d.attempts, d.attempt_base, d.traceparent, d.next_at
		)
		SELECT c.id, c.event_id, c.client_id, c.sensor_id, c.revision, c.payload, c.attempts, c.attempt_base, coalesce(c.traceparent, ''), c.next_at,
		       coalesce(cl.webhook_url, ''), coalesce(cl.signing_secret, ''), coalesce(cl.previous_secret, ''),
		       coalesce(cl.previous_secret_until, 'epoch'::timestamptz), coalesce(s.address, ''),
		       sub.client_id IS NOT NULL OR c.sensor_id = '`+testSensorID+`'
		FROM c
		LEFT JOIN clients cl ON cl.id = c.client_id
		LEFT JOIN sensors s ON s.id = c.sensor_id
		LEFT JOIN subscriptions sub ON sub.client_id = c.client_id AND sub.sensor_id = c.sensor_id`,
		ids, sensors, lease.Microseconds(), token)
}

func readLease(br pgx.BatchResults, token int64, leasedAt time.Time) ([]claimed, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []claimed
	for rows.Next() {
		c := claimed{token: token, leasedAt: leasedAt}
		if err := rows.Scan(&c.id, &c.eventID, &c.clientID, &c.sensorID, &c.revision, &c.payload, &c.attempts,
			&c.attemptBase, &c.traceparent, &c.due, &c.url, &c.secrets.Current, &c.secrets.Previous, &c.secrets.PreviousUntil, &c.address, &c.subscribed); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
