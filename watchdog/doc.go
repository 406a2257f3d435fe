// Package watchdog declares sensors lost when no reading came for lost_after, from the
// expiry of per-sensor keys in a JetStream KV bucket with limit markers.
//
// Every reading refreshes its sensor's key with a TTL of what is left of its lost_after; an
// expiry marker becomes a liveness_timeout fact appended to READINGS, from which the state
// projector decides "lost". An expiry is held while the pipeline (its partition's READINGS
// consumer, the upstream queue, the NATS connection) is behind, so an outage of ours raises
// no storm of lost/restored pairs, and settled at MaxHold at the latest. The decisions are
// pure functions of the time: heldDue (hold or settle) and judge (lost, still alive, or
// already declared). A reconciliation sweep repairs keys that differ from sensor_state.
//
// docs/watchdog.md describes the keys, the hold, bursts of expiries and the sweep.
package watchdog
