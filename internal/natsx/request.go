package natsx

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RequestTimeout bounds one JetStream API request on a part's way that a healthy stream
// leader answers in milliseconds. One sent while the stream has no leader goes unanswered;
// bounded, the part asks again soon after the cluster elects one, instead of after the API's
// default 5 s.
const RequestTimeout = 2 * time.Second

// Stream looks stream up (its info, current) within RequestTimeout.
func Stream(ctx context.Context, js jetstream.JetStream, stream string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	return js.Stream(ctx, stream)
}
