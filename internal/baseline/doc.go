// Package baseline holds the bare-client benchmarks every figure of BENCHMARKS.md is compared
// with, measured in the same run on the same machine: what RabbitMQ and JetStream allow here
// with nothing of ours in the way.
package baseline
