package history

import (
	"context"
	"time"
)

// batchGrace is how long a batch's context outlives its Send.
const batchGrace = 2 * time.Second

// batchTimeout bounds a batch whose caller set no deadline.
const batchTimeout = time.Minute

// batchContext is the context for a ClickHouse batch (PrepareBatch … Send) made under ctx,
// and the func to defer after Send. clickhouse-go watches a batch's context from a goroutine
// during Send and closes the batch's connection when the context ends; that goroutine may see
// the end only after Send has returned the connection to the pool, and then closes it under
// its next user (a RENAME of a rebuild's swap failed so, "use of closed network connection",
// when the copiers' errgroup context ended right after their last Send). The batch's context
// therefore keeps ctx's deadline but not its cancellation, and ends only batchGrace after
// Send.
func batchContext(ctx context.Context) (context.Context, func()) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(batchTimeout)
	}
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	return bctx, func() { time.AfterFunc(batchGrace, cancel) }
}
