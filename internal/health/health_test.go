package health_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lock-sensors/lock-sensors/internal/health"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	"github.com/lock-sensors/lock-sensors/internal/testenv"
)

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
)

func TestStatuses(t *testing.T) {
	t.Parallel()
	services := map[string][]string{
		"locks.v1.ClientService":   {"postgres"},
		"locks.v1.HistoryService":  {"clickhouse"},
		"locks.v1.SetAsideService": {"nats"},
	}
	for _, tc := range []struct {
		name    string
		results map[string]string
		want    map[string]healthpb.HealthCheckResponse_ServingStatus
	}{
		{"not read yet", nil, map[string]healthpb.HealthCheckResponse_ServingStatus{
			"": notServing, "locks.v1.ClientService": notServing, "locks.v1.HistoryService": notServing, "locks.v1.SetAsideService": notServing}},
		{"all ok", map[string]string{"postgres": "ok", "clickhouse": "ok", "nats": "ok"}, map[string]healthpb.HealthCheckResponse_ServingStatus{
			"": serving, "locks.v1.ClientService": serving, "locks.v1.HistoryService": serving, "locks.v1.SetAsideService": serving}},
		{"clickhouse down", map[string]string{"postgres": "ok", "clickhouse": "dial: refused", "nats": "ok"}, map[string]healthpb.HealthCheckResponse_ServingStatus{
			"": notServing, "locks.v1.ClientService": serving, "locks.v1.HistoryService": notServing, "locks.v1.SetAsideService": serving}},
		{"a check only the whole server needs", map[string]string{"postgres": "ok", "clickhouse": "ok", "nats": "ok", "rabbitmq": "refused"}, map[string]healthpb.HealthCheckResponse_ServingStatus{
			"": notServing, "locks.v1.ClientService": serving, "locks.v1.HistoryService": serving, "locks.v1.SetAsideService": serving}},
		{"a check this process does not run", map[string]string{"postgres": "ok"}, map[string]healthpb.HealthCheckResponse_ServingStatus{
			"": serving, "locks.v1.ClientService": serving, "locks.v1.HistoryService": serving, "locks.v1.SetAsideService": serving}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := health.Statuses(services, tc.results)
			if len(got) != len(tc.want) {
				t.Fatalf("Statuses = %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%q = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

// dependency is a TCP server a readiness check dials; Stop and Start make it go and come back
// on the same address.
type dependency struct {
	t    *testing.T
	addr string
	ln   net.Listener
}

func newDependency(t *testing.T) *dependency {
	d := &dependency{t: t, addr: testenv.FreeAddr(t)}
	d.Start()
	t.Cleanup(d.Stop)
	return d
}

func (d *dependency) Start() {
	ln, err := net.Listen("tcp", d.addr)
	if err != nil {
		d.t.Fatal(err)
	}
	d.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

func (d *dependency) Stop() { _ = d.ln.Close() }

func (d *dependency) check(ctx context.Context) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", d.addr)
	if err == nil {
		c.Close()
	}
	return err
}

// A grpc.health.v1 client on a real gRPC server sees SERVING and NOT_SERVING per service as
// the dependencies go and come back, a watch follows, health calls never run the checks,
// and stopping turns everything NOT_SERVING.
func TestHealthFollowsTheDependencies(t *testing.T) {
	t.Parallel()
	pg, ch := newDependency(t), newDependency(t)
	var rounds atomic.Int64
	srv := ops.New("127.0.0.1:0", prometheus.NewRegistry(), testenv.Logger(t))
	srv.AddCheck("postgres", func(ctx context.Context) error { rounds.Add(1); return pg.check(ctx) })
	srv.AddCheck("clickhouse", ch.check)
	h, err := health.New(health.Config{Every: 50 * time.Millisecond, Services: map[string][]string{
		"locks.v1.ClientService": {"postgres"}, "locks.v1.HistoryService": {"clickhouse"}}},
		health.Deps{Readiness: srv.Ready})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, h.Server())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := healthpb.NewHealthClient(conn)
	status := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		res, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return res.GetStatus()
	}
	expect := func(what string, want map[string]healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		testenv.Eventually(t, 5*time.Second, what, func() bool {
			for s, st := range want {
				if status(s) != st {
					return false
				}
			}
			return true
		})
	}

	if st := status(""); st != notServing {
		t.Errorf("before Run: %v, want NOT_SERVING", st)
	}
	// A watch gets the latest status (the server may fold changes in between), so it is
	// read up to each status the test waits for.
	wctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	watch, err := client.Watch(wctx, &healthpb.HealthCheckRequest{Service: "locks.v1.HistoryService"})
	if err != nil {
		t.Fatal(err)
	}
	watchUntil := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			res, err := watch.Recv()
			if err != nil {
				t.Fatalf("watch waiting for %v: %v", want, err)
			}
			if res.GetStatus() == want {
				return
			}
		}
	}
	stop := testenv.RunPart(t, "health", h.Run, 5*time.Second)
	expect("everything SERVING", map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": serving, "locks.v1.ClientService": serving, "locks.v1.HistoryService": serving})
	watchUntil(serving)

	ch.Stop()
	expect("history NOT_SERVING while ClickHouse is away", map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": notServing, "locks.v1.ClientService": serving, "locks.v1.HistoryService": notServing})
	watchUntil(notServing)
	ch.Start()
	expect("SERVING again", map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": serving, "locks.v1.HistoryService": serving})
	watchUntil(serving)

	if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "locks.v1.Nope"}); err == nil {
		t.Error("an unknown service answered without NOT_FOUND")
	}
	before, start := rounds.Load(), time.Now()
	for range 200 {
		status("")
	}
	// The checks ran on the ticker only, not once per call.
	if ran, ticks := rounds.Load()-before, int64(time.Since(start)/(50*time.Millisecond))+2; ran > ticks {
		t.Errorf("200 health calls ran the checks %d times in %d ticks", ran, ticks)
	}

	stop()
	watchUntil(notServing)
	if st := status(""); st != notServing {
		t.Errorf("after stop: %v, want NOT_SERVING", st)
	}
	if st := status("locks.v1.ClientService"); st != notServing {
		t.Errorf("ClientService after stop: %v, want NOT_SERVING", st)
	}
}
