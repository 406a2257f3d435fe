package lease

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// A renewal the client gave up on (a timeout) may still reach the server: the next renewal
// then meets a newer revision that names this same owner. The lease is kept, the worker
// goes on, and nothing is counted lost.
func TestRenewalThatLandedLateKeepsTheLease(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	_, pg := testenv.Postgres(t)
	a, err := New(Config{Name: "state", PartitionCount: 1, Owner: "owner-a", TTL: 3 * time.Second},
		Deps{Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry(), JS: ns.JS, PG: pg})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan context.Context, 4)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, func(ctx context.Context, _ int, _ int64) error {
			started <- ctx
			<-ctx.Done()
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	var work context.Context
	select {
	case work = <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("partition 0 was not claimed")
	}
	kv, err := ns.JS.KeyValue(t.Context(), Bucket("state"))
	if err != nil {
		t.Fatal(err)
	}
	// The late renewal: the same owner, one revision further than the assigner knows.
	if _, err := kv.Put(t.Context(), partitionKey(0), []byte("owner-a")); err != nil {
		t.Fatal(err)
	}
	// Three renewal rounds (TTL/3 each).
	time.Sleep(3 * time.Second)
	if lost := testutil.ToFloat64(a.lost); lost != 0 {
		t.Fatalf("%v partitions counted lost after a late renewal", lost)
	}
	if err := work.Err(); err != nil {
		t.Fatalf("the worker was stopped: %v", err)
	}
	select {
	case <-started:
		t.Fatal("the partition was claimed again: the lease had been dropped")
	default:
	}
	e, err := kv.Get(t.Context(), partitionKey(0))
	if err != nil || string(e.Value()) != "owner-a" {
		t.Fatalf("the lease key: %v, %v", e, err)
	}
}
