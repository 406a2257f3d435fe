package natsx

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamIdentity names a stream by its creation time, as a position kept outside NATS (a
// Postgres checkpoint) records it: a new stream (a lost or replaced store) has another, while
// a restart or a store restored from a backup keeps it. A position written on one stream
// says nothing about another, whose sequences start again at 1.
func StreamIdentity(info *jetstream.StreamInfo) string {
	return info.Created.UTC().Format(time.RFC3339Nano)
}
