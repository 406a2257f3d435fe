package natsx

import "github.com/nats-io/nats.go/jetstream"

// Extent is a stream as a part resumes on it: its identity (StreamIdentity) and its first
// and last sequences, against which a position kept outside NATS is judged.
type Extent struct {
	ID          string
	First, Last uint64
}

// ExtentOf is the Extent of the stream info describes.
func ExtentOf(info *jetstream.StreamInfo) Extent {
	return Extent{ID: StreamIdentity(info), First: info.State.FirstSeq, Last: info.State.LastSeq}
}
