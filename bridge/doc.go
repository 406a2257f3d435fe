// Package bridge consumes sensor readings from RabbitMQ, validates them (docs/contract.md section
// 1), and appends the valid ones to the partitioned READINGS stream; invalid ones go to the
// invalid queue with the reason. A RabbitMQ message is acked only after its effect is durable.
//
// The flow: one goroutine reads deliveries (manual acks, prefetch Config.Prefetch), decodes
// each one and starts its effect without waiting: an async JetStream append to
// readings.in.<sensor_id> (Nats-Msg-Id: see identity.go), or a
// publish of the original body to <queue>.invalid with the x-lock-sensors-error header under
// publisher confirms. A second goroutine takes the messages in delivery order, waits for each
// effect (JetStream's ack, RabbitMQ's confirm) and acks RabbitMQ with multiple=true up to the
// last one that is done, as soon as it would otherwise wait. At most Config.MaxInFlight
// messages are between receipt and ack.
//
// Failures: an append that fails or times out is retried with the same Nats-Msg-Id until
// JetStream acks it (the message stays unacked meanwhile), so a NATS restart loses nothing and
// records nothing twice; a sensor's later readings wait for the retry (order.go), so it never
// reorders a sensor's readings while other sensors' readings go on. A lost RabbitMQ connection ends the session:
// what was not acked is redelivered to the next one, which recognises what had already been
// appended (identity.go). The bridge reconnects with exponential backoff
// (Config.ReconnectMin to ReconnectMax) and logs every connect and disconnect.
//
// Files, one concept each: config.go, bridge.go (New, Run's reconnect loop), session.go (one
// RabbitMQ session: connections, queues, the read loop), handle.go (one delivery's effect),
// order.go (per-sensor order), acker.go (resolve and ack in delivery order), retry.go,
// identity.go (recognising a redelivery), messageid.go, decode.go, clock.go, metrics.go.
//
// Where docs/contract.md is silent, Decode decides (and its doc says): data is the exact JSON
// number 0 or 1 in any spelling (1.0 and 1e0 are accepted; "1", true, null, 2 and 0.5 are
// not); ts null is the same as absent; a ts must be RFC 3339 with a zone; a message_id-less
// message's identity (used only to recognise a redelivery) is a digest of its body,
// timestamp, headers (except those RabbitMQ adds on redelivery or dead-lettering),
// correlation id, type and app id.
package bridge
