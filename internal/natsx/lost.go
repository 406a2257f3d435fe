package natsx

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go"
)

// ErrConnLost is the cause of a context of UntilLost ended by the loss of its connection.
var ErrConnLost = errors.New("the NATS connection was lost")

// losses holds one watcher per connection.
var losses = struct {
	sync.Mutex
	by map[*nats.Conn]*connLoss
}{by: map[*nats.Conn]*connLoss{}}

// closed is what Lost gives for a connection closed already.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// connLoss closes ch when its connection is lost, and makes a new one for the next.
type connLoss struct {
	mu sync.Mutex
	ch chan struct{}
}

// Lost returns a channel closed when nc's connection of now is lost (disconnected, or
// reconnecting). What was sent on it and waits for an answer then waits in vain: answers
// go to the connection that asked, so a request or an ack in flight is lost with it, and
// waiting for its timeout holds everything behind it.
func Lost(nc *nats.Conn) <-chan struct{} {
	if nc.IsClosed() {
		return closed
	}
	losses.Lock()
	l, ok := losses.by[nc]
	if !ok {
		l = &connLoss{ch: make(chan struct{})}
		losses.by[nc] = l
		st := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
		go l.watch(nc, st)
	}
	losses.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ch
}

func (l *connLoss) watch(nc *nats.Conn, st chan nats.Status) {
	for s := range st {
		l.mu.Lock()
		close(l.ch)
		l.ch = make(chan struct{})
		l.mu.Unlock()
		if s == nats.CLOSED {
			losses.Lock()
			delete(losses.by, nc)
			losses.Unlock()
			nc.RemoveStatusListener(st)
			return
		}
	}
}

// UntilLost is ctx, also ended (with cause ErrConnLost) when nc's connection of now is
// lost: a request made with it fails at once with the connection instead of at its timeout.
func UntilLost(ctx context.Context, nc *nats.Conn) (context.Context, context.CancelFunc) {
	lost := Lost(nc)
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-lost:
			cancel(ErrConnLost)
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}
