// Package watchdog declares sensors lost when no reading came for lost_after, from the
// expiry of per-sensor keys in a JetStream KV bucket with limit markers.
package watchdog
