// Package notifier turns EVENTS into signed webhook deliveries with durable, growing retries.
//
// Ingest writes a notifier_deliveries row per (event, subscribed client) in Postgres before it
// acknowledges EVENTS; a dispatcher claims due rows under a lease and attempts each; a
// finisher writes the outcomes (delivered, next attempt, dead, cancelled, superseded) with
// their attempt records in an outbox that a relay publishes to DELIVERIES. Per (client,
// sensor) rows go in revision order and a newer event supersedes an older one waiting for a
// retry; a per-endpoint limit and circuit breaker keep one bad receiver from delaying others.
// The retry (Policy), breaker (breakerPolicy), supersede (supersede.go) and auto-disable
// (disableVerdict) decisions are pure functions of (state, facts, now).
//
// docs/notifier.md describes the flow, why a Postgres timer table, and the guarantees.
package notifier
