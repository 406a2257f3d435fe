// Package projector applies the READINGS log to projections: the state projector (Postgres
// sensor_state with exactly-once checkpoints and an outbox relayed to EVENTS) and the
// history projector (ClickHouse, in batches).
package projector
