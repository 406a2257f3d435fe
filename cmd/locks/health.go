package main

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/lock-sensors/lock-sensors/internal/health"
	"github.com/lock-sensors/lock-sensors/internal/ops"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// apiServiceChecks are the readiness checks each admin API service needs to answer: its
// grpc.health.v1 status is SERVING while they pass (the server as a whole, service "",
// needs every check of the process).
var apiServiceChecks = map[string][]string{
	locksv1.ClientService_ServiceDesc.ServiceName:         {"postgres"},
	locksv1.SensorService_ServiceDesc.ServiceName:         {"postgres"},
	locksv1.SubscriptionService_ServiceDesc.ServiceName:   {"postgres"},
	locksv1.StateService_ServiceDesc.ServiceName:          {"postgres"},
	locksv1.AlertService_ServiceDesc.ServiceName:          {"postgres"},
	locksv1.OverviewService_ServiceDesc.ServiceName:       {"postgres"},
	locksv1.WebhookControlService_ServiceDesc.ServiceName: {"postgres", "nats"},
	locksv1.HistoryService_ServiceDesc.ServiceName:        {"clickhouse"},
	locksv1.ProjectionService_ServiceDesc.ServiceName:     {"postgres", "clickhouse", "nats"},
	locksv1.SetAsideService_ServiceDesc.ServiceName:       {"nats"},
	locksv1.ClientTokenService_ServiceDesc.ServiceName:    {"postgres"},
	locksv1.ClientEventService_ServiceDesc.ServiceName:    {"postgres"},
}

// newHealth is the gRPC port's health service, read from the ops server's cached readiness
// (the round /readyz answers with), so a health call never runs a check.
func newHealth(srv *ops.Server) (*health.Health, error) {
	return health.New(health.Config{Services: apiServiceChecks}, health.Deps{Readiness: srv.Ready})
}

// together runs a and b until both return; the first error wins.
type together struct{ a, b runner }

func (t together) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return t.a.Run(ctx) })
	g.Go(func() error { return t.b.Run(ctx) })
	return g.Wait()
}
