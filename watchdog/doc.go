// Package watchdog declares sensors lost when no reading came for lost_after, from the
// expiry of per-sensor keys in a JetStream KV bucket with limit markers.
//
// Every reading in READINGS refreshes its sensor's key ("<partition>.<sensor_id>", so that a
// process watches only the keys of the partitions it owns) in the `liveness` bucket with a
// per-message TTL of what is left of the sensor's lost_after (sensors.lost_after_ms, or
// LOCKS_LOST_AFTER), counted from the reading's receive time. When a key expires the server
// writes a delete marker (Nats-Marker-Reason: MaxAge) in its place; the watchdog watches the
// bucket, and turns a marker into a `liveness_timeout` fact appended to the sensor's
// partition of READINGS. It never decides "lost" itself: the state projector does, from the
// log alone (fact time − last reading ≥ lost_after), so replays give the same answer.
//
// The server counts per-message TTLs in whole seconds, so the TTL is rounded up: a fact comes
// up to about a second after the deadline (plus the server's expiry timer), never before it.
// Markers live 24 h (natsx.Declare), so one that expires while the watchdog is down is still
// there, replayed by the watcher, when it comes back; the sweep catches anything older.
//
// No false alarm from our own lag: an expiry is held while the watchdog's READINGS consumer of
// that partition has not yet applied every reading stored before the expiry, and while the
// upstream (the RabbitMQ queue the bridge drains) is behind, as told by the Lag hook, or our
// NATS connection is down, and for CatchUpGrace after either (what the bridge holds unacked
// is not in the queue's ready count, and may still be on its way into READINGS). Once
// caught up, each held expiry is checked against the sensor's last message in READINGS (the
// truth): a sensor whose last reading is younger than lost_after gets its key refreshed, one
// whose last message is already a liveness_timeout gets nothing, the others get their fact.
// So an outage of ours yields no storm of lost/restored pairs. A backlog must not hide a
// silent sensor for ever, though: an expiry held for MaxHold is settled the same way while
// the pipeline is still behind (a sensor whose reading is stuck upstream is then declared,
// and restored when the reading arrives), logged and counted as declared at the bound.
//
// A declared sensor's marker is overwritten by a value without TTL marking it declared, so a
// restart does not re-declare it; a repeated append is also de-duplicated by its Nats-Msg-Id
// (sensor and the READINGS sequence of its last reading).
//
// A burst of expiries (a power cut, a network down for a building) is settled by a few
// workers from a queue, a batch at a time: one direct get reads the batch's last messages, the
// facts are published asynchronously and their acks awaited together, and the declared marks
// wait until no expiry is left waiting for its fact.
//
// A reconciliation sweep compares sensor_state.last_seen with the keys and repairs any
// difference, counted in locks_watchdog_reconcile_repairs_total (which should stay 0).
package watchdog
