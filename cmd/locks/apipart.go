package main

import (
	"context"
	"fmt"
	"net"

	"github.com/lock-sensors/lock-sensors/api"
	"github.com/lock-sensors/lock-sensors/history"
	"github.com/lock-sensors/lock-sensors/notifier"
	"github.com/lock-sensors/lock-sensors/ui"
)

// apiOn serves the API's gRPC on a listener bound beforehand.
type apiOn struct {
	a  *api.Server
	ln net.Listener
}

func (p apiOn) Run(ctx context.Context) error { return p.a.Serve(ctx, p.ln) }

// newAPIPart wires the API: REST and the dashboard on the ops server, gRPC on its own
// address, and the rebuilds started through it.
func newAPIPart(d deps) (runner, error) {
	hist, err := history.New(d.ch)
	if err != nil {
		return nil, err
	}
	// Rebuilds started through the API run in this process, and stop with the API.
	rb, err := newRebuildRunner(d)
	if err != nil {
		return nil, err
	}
	hl, err := newHealth(d.ops)
	if err != nil {
		return nil, err
	}
	a, err := api.New(api.Config{GRPCAddr: d.cfg.GRPCAddr, Tokens: d.cfg.APITokens, WebhookAllowPrivate: d.cfg.WebhookAllowPrivate,
		StateSeenInterval: d.cfg.StateSeenInterval},
		api.Deps{PG: d.pg, Logger: d.log, Registerer: d.reg, History: hist, Projections: rb, JS: d.js,
			DeadLetters: notifier.NewDeadLetters(notifier.DeadLettersDeps{PG: d.pg}),
			Controls:    notifier.NewControls(notifier.ControlsDeps{PG: d.pg, NC: d.js.Conn()}), Health: hl.Server()})
	if err != nil {
		return nil, err
	}
	h := a.Handler()
	d.ops.Handle("/v1/", h)
	d.ops.Handle("GET /openapi.json", h)
	dash, err := ui.New(ui.Config{Tokens: d.cfg.APITokens, Refresh: d.cfg.UIRefresh}, ui.Deps{Logger: d.log, Registerer: d.reg, API: a.InProcess(), JS: d.js,
		ClientTokens: a})
	if err != nil {
		return nil, err
	}
	d.ops.Handle("/ui/", dash.Handler())
	// /readyz shows its checks' error text only with an API token.
	d.ops.ShowDetailsTo(a.Authorized)
	// The gRPC address is bound now, before the ops server answers /readyz: bound in Run,
	// a taken address stopped the process only after it had said it was ready.
	grpcLn, err := net.Listen("tcp", d.cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_GRPC_ADDR=%s: %w", d.cfg.GRPCAddr, err)
	}
	return together{together{apiOn{a, grpcLn}, rb}, hl}, nil
}
