package natsx

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotDeclared says a stream or bucket a part relies on does not exist.
var ErrNotDeclared = errors.New("not declared")

// CheckDeclared is Declare for a NATS user that may not create or update streams (a part's
// user in deploy/nats/accounts.conf): it only looks the streams and buckets up, and refuses a
// READINGS stream partitioned otherwise than c says, as Declare does.
func CheckDeclared(ctx context.Context, js jetstream.JetStream, c StreamsConfig) error {
	names := []string{ReadingsStream, EventsStream, DeliveriesStream, SetAsideStream, LogsStream,
		"KV_" + LivenessBucket, "KV_" + BridgeSessionsBucket, "KV_" + ProcessesBucket}
	for _, part := range LeaseParts {
		names = append(names, "KV_"+LeasesBucket(part))
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s: %w; declare the streams once with the admin user "+
				"(`locks migrate` with LOCKS_NATS_URL set)", name, ErrNotDeclared)
		}
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", name, err)
		}
		if name != ReadingsStream {
			continue
		}
		have, want := s.CachedInfo().Config.SubjectTransform, readingsConfig(c).SubjectTransform
		if have == nil || *have != *want {
			return fmt.Errorf("%w: stream %s maps subjects %v, the configuration wants %v; keep "+
				"LOCKS_PARTITIONS as the stream was declared", ErrIncompatible, name, transformString(have), transformString(want))
		}
	}
	return nil
}
