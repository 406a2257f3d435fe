package lease

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

// The tests mostly wait on leases lapsing, each on an embedded server of its own.
func TestMain(m *testing.M) { testenv.Main(m, 8) }

// bucketAway runs an assigner of one partition whose NATS connection goes through a proxy, and
// waits for its worker. away() then loses every answer of the lease bucket, as when the
// bucket's stream has no leader after a NATS node died, until the returned function is called.
type bucketAway struct {
	a       *Assigner
	kv      jetstream.KeyValue // the bucket, seen directly (not through the proxy)
	started chan context.Context
	work    context.Context // the first worker's
	proxy   *testenv.NATSProxy
}

const awayTTL = 2 * time.Second

func startBucketAway(t *testing.T) *bucketAway {
	t.Helper()
	ns := testenv.NATS(t)
	_, pg := testenv.Postgres(t)
	b := &bucketAway{proxy: testenv.NewNATSProxy(t, ns.URL), started: make(chan context.Context, 4)}
	nc, err := nats.Connect(b.proxy.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b.a, err = New(Config{Name: "state", PartitionCount: 1, Owner: "owner-a", TTL: awayTTL},
		Deps{Logger: testenv.Logger(t), Registerer: prometheus.NewRegistry(), JS: js, PG: pg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- b.a.Run(ctx, func(ctx context.Context, _ int, _ int64) error {
			b.started <- ctx
			<-ctx.Done()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case b.work = <-b.started:
	case <-time.After(20 * time.Second):
		t.Fatal("partition 0 was not claimed")
	}
	if b.kv, err = ns.JS.KeyValue(t.Context(), Bucket("state")); err != nil {
		t.Fatal(err)
	}
	return b
}

// away loses the bucket's answers until the bucket's own TTL has removed the lease and the
// worker's lease has lapsed (Valid says no); the returned function brings the bucket back.
func (b *bucketAway) away(t *testing.T) (back func()) {
	t.Helper()
	stream := []byte("KV_" + Bucket("state"))
	back = b.proxy.Lose(func(subject, _ string, body []byte) bool {
		return strings.HasPrefix(subject, "$KV."+Bucket("state")+".") || bytes.Contains(body, stream)
	})
	testenv.Eventually(t, 5*awayTTL, "the bucket's TTL to remove the unrenewed lease", func() bool {
		_, err := b.kv.Get(t.Context(), partitionKey(0))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	testenv.Eventually(t, 5*awayTTL, "the worker's lease to lapse", func() bool { return !Valid(b.work) })
	return back
}

// A lease bucket that answers nothing past the TTL (its stream electing a leader) does not stop
// the partition: the worker goes on, fenced in Postgres, and once the bucket answers again
// the lease it dropped meanwhile is created again for the same owner, with nothing counted
// lost and no second worker.
func TestLeaseOutlivesItsBucketsElection(t *testing.T) {
	t.Parallel()
	b := startBucketAway(t)
	back := b.away(t)
	if err := b.work.Err(); err != nil {
		t.Fatalf("the worker was stopped while the bucket was away: %v", err)
	}
	back()
	testenv.Eventually(t, 5*awayTTL, "the lease to be held again", func() bool {
		e, err := b.kv.Get(t.Context(), partitionKey(0))
		return err == nil && string(e.Value()) == "owner-a" && Valid(b.work)
	})
	if err := b.work.Err(); err != nil {
		t.Fatalf("the worker was stopped: %v", err)
	}
	if lost := testutil.ToFloat64(b.a.lost); lost != 0 {
		t.Errorf("%v partitions counted lost", lost)
	}
	select {
	case <-b.started:
		t.Error("the partition was claimed again with a second worker")
	default:
	}
}

// The same, but another process took the lease while the bucket was away from this one: the
// first renewal that reaches the bucket finds it taken and stops the worker.
func TestLeaseTakenWhileItsBucketWasAwayStopsTheWorker(t *testing.T) {
	t.Parallel()
	b := startBucketAway(t)
	back := b.away(t)
	if _, err := b.kv.Create(t.Context(), partitionKey(0), []byte("owner-b")); err != nil {
		t.Fatal(err)
	}
	back()
	select {
	case <-b.work.Done():
	case <-time.After(5 * awayTTL):
		t.Fatal("the worker goes on though another process holds the lease")
	}
	if lost := testutil.ToFloat64(b.a.lost); lost != 1 {
		t.Errorf("%v partitions counted lost, want 1", lost)
	}
}
