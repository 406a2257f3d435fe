package bridge

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go"
)

// errConnLost fails an append whose NATS connection was lost while it waited for its ack.
var errConnLost = errors.New("the NATS connection was lost before the append's ack came")

// connLoss tells the appends in flight that the NATS connection they went out on was lost:
// their acks, answered to that connection, never come, and waiting PublishTimeout for each
// would hold every reading behind them. Each loss closes the channel current gave out, and a
// new one stands for the next connection. Retried with its Nats-Msg-Id, an append that was
// stored after all is recorded once.
type connLoss struct {
	mu sync.Mutex
	ch chan struct{}
}

func newConnLoss() *connLoss { return &connLoss{ch: make(chan struct{})} }

// current is closed when the connection of now is lost.
func (l *connLoss) current() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ch
}

// watch follows nc's status until ctx is done.
func (l *connLoss) watch(ctx context.Context, nc *nats.Conn) {
	st := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING)
	defer nc.RemoveStatusListener(st)
	for {
		select {
		case <-ctx.Done():
			return
		case <-st:
			l.mu.Lock()
			close(l.ch)
			l.ch = make(chan struct{})
			l.mu.Unlock()
		}
	}
}
