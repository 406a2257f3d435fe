package natsx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// Lost closes its channel when the connection goes (and only then), and the next call gives
// the next connection's; UntilLost ends a request's context with ErrConnLost at that moment.
func TestLostFollowsTheConnection(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	proxy := testenv.NewNATSProxy(t, ns.URL)
	nc := testenv.JetStream(t, proxy.URL, "lost").Conn()
	first := natsx.Lost(nc)
	ctx, cancel := natsx.UntilLost(t.Context(), nc)
	defer cancel()
	select {
	case <-first:
		t.Fatal("lost before the connection went")
	case <-time.After(200 * time.Millisecond):
	}
	proxy.Cut()
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection was cut and Lost's channel stayed open")
	}
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), natsx.ErrConnLost) {
		t.Fatalf("UntilLost's context ended with %v, want ErrConnLost", context.Cause(ctx))
	}
	testenv.Eventually(t, 5*time.Second, "the reconnection", nc.IsConnected)
	if next := natsx.Lost(nc); next == first {
		t.Fatal("Lost gives the lost connection's channel again")
	}
	nc.Close()
	select {
	case <-natsx.Lost(nc):
	case <-time.After(time.Second):
		t.Fatal("a closed connection's Lost stays open")
	}
}
