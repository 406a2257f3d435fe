// Package faults holds the fault suite of issue 15 (tests only): the scaled topology of
// deploy/cluster under load from the load generator, with NATS nodes and state processes
// killed or paused mid-run, checked against the load generator's books. It takes minutes, so
// it runs only with LOCKS_FAULTS=1, which `go tool task faults` sets.
package faults
