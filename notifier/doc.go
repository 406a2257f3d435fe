// Package notifier turns EVENTS into signed webhook deliveries with durable, growing retries.
//
// # Flow
//
// A durable JetStream consumer per EVENTS partition feeds batches to one ingest loop, which
// inserts, in one Postgres transaction, a row of notifier_deliveries per (event, client
// subscribed to the sensor at that moment), idempotently by (event_id, client_id), and only
// then acknowledges the messages. A dispatcher claims due rows (FOR UPDATE SKIP LOCKED, with
// a lease longer than one attempt's timeout), re-reading the client's URL, secrets and
// subscription and the sensor's address in the same statement, and runs each attempt in
// its own goroutine. A finisher writes the outcomes in batches (delivered, the next attempt
// time, dead, cancelled, superseded) together with the attempt records in an outbox table,
// which a relay publishes to DELIVERIES (Nats-Msg-Id = event.AttemptMsgID) and then deletes.
//
// # Why a Postgres timer table, not JetStream redelivery or message schedules
//
// The retry state must outlive restarts of the notifier and of NATS, and it must also answer
// questions JetStream cannot answer cheaply: "is a newer revision of this sensor waiting for
// this client?" (supersede), "is another revision of this key in flight?" (per-key order),
// "which deliveries of this client are dead?" and "send them again" (dead letters and
// redrive), "how many attempts has it had?" after a redrive. NakWithDelay keeps the delay
// only in the consumer's in-memory/raft state, bounded by MaxDeliver and tied to one
// message: supersede would need a second lookup store anyway, and a redrive would have to
// re-publish. Message schedules would make each retry a new message, again with no way to
// cancel the older ones. One table gives all of it with one index per question, and
// transactions make each step atomic: a row is the durable timer (next_at), the work item
// (leased by lease_until/lease_token so several notifier processes share the work), the
// ordering ledger and the dead-letter list. EVENTS stays the truth; the table is the
// notifier's own progress over it.
//
// # Guarantees
//
//   - Nothing lost: EVENTS messages are acked after the rows commit; an attempt's outcome
//     and its record commit together; a crash mid-attempt leaves the lease to expire and the
//     attempt is made again (at least once: receivers de-duplicate by webhook-id).
//   - Order and supersede per (client, sensor): a row is claimable only when no pending row
//     of a lower revision exists for its key and no other row of the key is in flight, so a
//     healthy receiver gets every revision in order. Newer events mark the older rows that
//     wait for a retry (failed at least once) superseded at ingest, and a failed attempt
//     of a row that has a newer one is superseded instead of retried; an older row whose attempt
//     is in flight is flagged (supersede_on_finish) and superseded when that attempt fails
//     (not when it was delivered, nor when it was aborted by this process and had never
//     failed before: it is sent again, first) — flag and outcome are both UPDATEs of the row, so they
//     serialise on its lock and neither misses the other; a periodic sweep catches rows a
//     crashed process left behind. Claiming takes an advisory lock per key and re-checks
//     in a fresh snapshot, so two processes cannot put two revisions of one key in flight.
//     Redrive never revives a revision older than the newest one of its key.
//   - Several notifier processes share one table: ingest is split by EVENTS partition
//     (one durable consumer per partition), sending by claims. The per-endpoint limit and
//     the circuit breaker are per process; an operator's fix (redrive, resend, re-enable)
//     resets a client's breaker in all of them over core NATS (reset.go).
//   - A disabled client (controls.go, disable.go) is excluded from claims: its deliveries
//     wait, pending and in order, until it is re-enabled.
//   - Isolation: an adaptive limit of attempts per client in flight per process (from
//     Config.PerEndpoint) and a circuit breaker per client; a client that cannot take an
//     attempt or queue a row is excluded from claims, so its backlog waits in Postgres
//     instead of holding slots, and every attempt is bounded by LOCKS_WEBHOOK_TIMEOUT.
//   - Throughput to one client: a healthy endpoint keeps rows claimed ahead (queue.go), so
//     an attempt that ends starts the next one without a claim; queued rows hold no slot,
//     and are given back unattempted when the breaker opens, when stopping, before their
//     lease could expire, after 2 s, or when the API says the client's registry entry
//     changed (URL, secret, filters, subscriptions, deletion; core NATS): the contract reads
//     the webhook URL afresh at every attempt, so a queued row is sent only with a fresh read.
//   - Outgoing requests: the resolved address is checked at dial time (no loopback, private,
//     link-local or other internal targets unless LOCKS_WEBHOOK_ALLOW_PRIVATE), no proxy, no
//     redirects followed (a 3xx is a failed attempt), kept-alive connections.
//
// # Retries
//
// LOCKS_RETRY_SCHEDULE lists the delays before attempts 2, 3, …; Policy.Next is that table
// and Policy.Delay adds up to 20% jitter (never less than the schedule) and honours a
// Retry-After of a 429 or 503, up to the longest delay of the schedule. After the last
// attempt the row is dead; DeadLetters (ListDead, Redrive) serves the admin API.
package notifier
