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

// disableVerdict is the auto-disable decision for one client at now: its endpoint has failed
// every attempt since failingSince (nil: its latest attempt succeeded), lastErr being the
// latest failure, and after is LOCKS_ENDPOINT_DISABLE_AFTER (zero: never disable). A client
// failing for after or longer is disabled, with the reason returned.
func disableVerdict(failingSince *time.Time, lastErr string, after time.Duration, now time.Time) (reason string, disable bool) {
	if after <= 0 || failingSince == nil || now.Before(failingSince.Add(after)) {
		return "", false
	}
	if lastErr == "" {
		lastErr = "no 2xx answer"
	}
	return fmt.Sprintf("every attempt failed since %s, for longer than %s (LOCKS_ENDPOINT_DISABLE_AFTER); last: %s",
		failingSince.UTC().Format("2006-01-02T15:04:05Z"), after, lastErr), true
}

// disabling is a client disableVerdict disables, with the reason recorded.
type disabling struct{ client, reason string }

// toDisable applies disableVerdict to each client of hs, with since its failing_since as
// recorded (queueHealth's RETURNING, the batch merged in).
func toDisable(hs []health, since map[string]*time.Time, after time.Duration, now time.Time) []disabling {
	var ds []disabling
	for _, h := range hs {
		if why, ok := disableVerdict(since[h.client], h.lastErr, after, now); ok {
			ds = append(ds, disabling{h.client, why})
		}
	}
	return ds
}

// queueHealth queues on b, for the finish transaction, the statement that records since
// when each endpoint of hs has failed without a 2xx, and returns that time per client (the
// upsert keeps the row locked to the commit, so the decision on it holds). readHealth reads it.
func queueHealth(b *pgx.Batch, hs []health) {
	clients := make([]string, len(hs))
	fails := make([]*time.Time, len(hs))
	oks := make([]*time.Time, len(hs))
	for i, h := range hs {
		clients[i], fails[i], oks[i] = h.client, h.failSince, h.lastOK
	}
	// A success in the batch restarts the count from the batch's failures after it; without
	// one, the count goes on from the earlier failing_since.
	b.Queue(`
		INSERT INTO notifier_endpoint_health AS h (client_id, failing_since, last_success_at)
		SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[])
		ON CONFLICT (client_id) DO UPDATE SET
			failing_since = CASE WHEN excluded.last_success_at IS NOT NULL THEN excluded.failing_since
			                     ELSE coalesce(h.failing_since, excluded.failing_since) END,
			last_success_at = greatest(h.last_success_at, excluded.last_success_at)
		RETURNING h.client_id, h.failing_since`, clients, fails, oks)
}

// readHealth reads queueHealth's result: each client's failing_since.
func readHealth(br pgx.BatchResults) (map[string]*time.Time, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("record endpoint health: %w", err)
	}
	since := map[string]*time.Time{}
	var id string
	var at *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		since[id] = at
		at = nil // a fresh time for the next row, not this one's overwritten
		return nil
	}); err != nil {
		return nil, fmt.Errorf("record endpoint health: %w", err)
	}
	return since, nil
}

// queueDisable queues on b the UPDATE that disables the clients of ds, each unless an
// operator disabled it meanwhile; readDisabled reads it.
func queueDisable(b *pgx.Batch, ds []disabling) {
	clients := make([]string, len(ds))
	reasons := make([]string, len(ds))
	for i, d := range ds {
		clients[i], reasons[i] = d.client, d.reason
	}
	b.Queue(`
		UPDATE clients c SET disabled_at = now(), version = c.version + 1, updated_at = now(), disabled_reason = r.reason
		FROM unnest($1::text[], $2::text[]) AS r(client_id, reason)
		WHERE r.client_id = c.id AND c.disabled_at IS NULL
		RETURNING c.id, c.disabled_reason`, clients, reasons)
}

// readDisabled reads queueDisable's result: the clients disabled, with their reasons.
func readDisabled(br pgx.BatchResults) (map[string]string, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("disable failing endpoints: %w", err)
	}
	disabled := map[string]string{}
	var id, why string
	if _, err := pgx.ForEachRow(rows, []any{&id, &why}, func() error {
		disabled[id] = why
		return nil
	}); err != nil {
		return nil, fmt.Errorf("disable failing endpoints: %w", err)
	}
	return disabled, nil
}
