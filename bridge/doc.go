// Package bridge consumes sensor readings from RabbitMQ, validates them (CONTRACT.md section
// 1), and appends the valid ones to the partitioned READINGS stream; invalid ones go to the
// invalid queue with the reason. A RabbitMQ message is acked only after its effect is durable.
package bridge
