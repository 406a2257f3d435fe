package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/procs"
)

// processPresence is this process in the registry and its warnings in LOGS (internal/procs).
type processPresence struct {
	id   string
	part string // natsx.ProcessPart of the targets: the prefix of its key and LOGS subject
	tee  *procs.LogTee
}

// newPresence makes the process id and wraps log so that its WARN+ records also go to LOGS
// once NATS is up (they wait in a bounded buffer until then).
func newPresence(log *slog.Logger, reg prometheus.Registerer, targets []string) (*processPresence, *slog.Logger) {
	host, _ := os.Hostname()
	p := &processPresence{id: procs.NewID(host, os.Getpid()), part: natsx.ProcessPart(targets)}
	p.tee = procs.NewLogTee(natsx.ProcessKey(p.part, p.id), 0)
	reg.MustRegister(p.tee.Collectors()...)
	return p, slog.New(p.tee.Handler(log.Handler()))
}

// runners are the registry key and the log tee, to run beside the parts.
func (p *processPresence) runners(js jetstream.JetStream, parts []string, httpAddr string, log *slog.Logger) ([]func(context.Context) error, error) {
	r, err := procs.New(procs.Config{ID: p.id, Part: p.part, Parts: parts, Version: versionString(), HTTPAddr: httpAddr},
		procs.Deps{Logger: log, JS: js})
	if err != nil {
		return nil, err
	}
	return []func(context.Context) error{r.Run, func(ctx context.Context) error { return p.tee.Run(ctx, js) }}, nil
}
