// Package alerter tells the administrator when something needs a human (issue 16): it
// re-evaluates a set of level conditions every Config.Interval (dead letters, disabled
// endpoints, lagging projections, set-aside messages, checkpoint mismatches, reconciliation
// drift, mass loss, stopped processes), keeps one firing row per (kind, subject) in
// Postgres, and sends each firing and resolved notice by e-mail and operator webhook from a
// durable outbox written in the transition's transaction.
//
// One process at a time evaluates and sends: the holder of a Postgres advisory lock on a
// dedicated connection; the others wait as standbys and take over when its session ends.
package alerter
