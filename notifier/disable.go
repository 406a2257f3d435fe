package notifier

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// DisableAfterDefault is LOCKS_ENDPOINT_DISABLE_AFTER's default: a day without a single 2xx
// outlasts any outage a receiver's owner would fix by themselves, and stops the retries from
// using up every delivery's schedule (they wait, pending, until the re-enable).
const DisableAfterDefault = 24 * time.Hour

// notDisabled keeps the deliveries of a disabled client out of claims: they wait, pending
// and in order, without attempts, until an operator re-enables the client.
const notDisabled = `NOT EXISTS (SELECT 1 FROM clients dc WHERE dc.id = d.client_id AND dc.disabled_at IS NOT NULL)`

// health is what a batch of attempt outcomes says about one client's endpoint.
type health struct {
	client    string
	lastOK    *time.Time // the batch's last success
	failSince *time.Time // the first failure after lastOK (or in the batch, without one)
	lastErr   string     // the batch's last failure
}

// healthOf summarises the attempts among rs per client, in client order (the lock order).
func healthOf(rs []result) []health {
	by := map[string]*health{}
	sorted := slices.SortedFunc(slices.Values(rs), func(a, b result) int { return a.at.Compare(b.at) })
	for _, r := range sorted {
		if r.aborted || r.state == StateCancelled {
			continue // not an attempt at the endpoint
		}
		h := by[r.c.clientID]
		if h == nil {
			h = &health{client: r.c.clientID}
			by[r.c.clientID] = h
		}
		at := r.at
		if r.state == StateDelivered {
			h.lastOK, h.failSince = &at, nil
			continue
		}
		h.lastErr = r.errText
		if h.failSince == nil {
			h.failSince = &at
		}
	}
	out := make([]health, 0, len(by))
	for _, h := range by {
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b health) int { return cmp.Compare(a.client, b.client) })
	return out
}

// healthStmts says which statements queueHealth queued, for read.
type healthStmts struct{ health, disable bool }

// queueHealth queues on b, for the finish transaction, the statements that record since
// when each endpoint of rs has failed without a 2xx, and disable those failing for longer
// than after (never when after is zero).
func queueHealth(b *pgx.Batch, rs []result, after time.Duration) healthStmts {
	hs := healthOf(rs)
	if len(hs) == 0 {
		return healthStmts{}
	}
	clients := make([]string, len(hs))
	fails := make([]*time.Time, len(hs))
	oks := make([]*time.Time, len(hs))
	lastErrs := make([]string, len(hs))
	for i, h := range hs {
		clients[i], fails[i], oks[i], lastErrs[i] = h.client, h.failSince, h.lastOK, h.lastErr
	}
	// A success in the batch restarts the count from the batch's failures after it; without
	// one, the count goes on from the earlier failing_since.
	b.Queue(`
		INSERT INTO notifier_endpoint_health AS h (client_id, failing_since, last_success_at)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[])
		ON CONFLICT (client_id) DO UPDATE SET
			failing_since = CASE WHEN excluded.last_success_at IS NOT NULL THEN excluded.failing_since
			                     ELSE coalesce(h.failing_since, excluded.failing_since) END,
			last_success_at = greatest(h.last_success_at, excluded.last_success_at)`, clients, fails, oks)
	if after <= 0 {
		return healthStmts{health: true}
	}
	b.Queue(`
		UPDATE clients c SET disabled_at = now(), version = c.version + 1, updated_at = now(),
			disabled_reason = format('every attempt failed since %s, for longer than %s (LOCKS_ENDPOINT_DISABLE_AFTER); last: %s',
				to_char(h.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), $3::text, coalesce(nullif(r.err, ''), 'no 2xx answer'))
		FROM notifier_endpoint_health h, unnest($1::text[], $4::text[]) AS r(client_id, err)
		WHERE h.client_id = c.id AND r.client_id = c.id AND c.disabled_at IS NULL
		  AND h.failing_since <= now() - $2 * interval '1 microsecond'
		RETURNING c.id, c.disabled_reason`, clients, after.Microseconds(), after.String(), lastErrs)
	return healthStmts{health: true, disable: true}
}

// read takes the queued statements' results from br: the clients disabled, with their reasons.
func (q healthStmts) read(br pgx.BatchResults) (map[string]string, error) {
	if !q.health {
		return nil, nil
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("record endpoint health: %w", err)
	}
	if !q.disable {
		return nil, nil
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("disable failing endpoints: %w", err)
	}
	disabled := map[string]string{}
	for rows.Next() {
		var id, why string
		if err := rows.Scan(&id, &why); err != nil {
			rows.Close()
			return nil, fmt.Errorf("disable failing endpoints: %w", err)
		}
		disabled[id] = why
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("disable failing endpoints: %w", err)
	}
	return disabled, nil
}
