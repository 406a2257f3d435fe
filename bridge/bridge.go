package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// Deps are the bridge's collaborators; none may be nil.
type Deps struct {
	// JS is used for its NATS connection (which must reconnect by itself, as
	// natsx.Connect's does); the bridge makes its own JetStream context on it with a bounded
	// async publisher.
	JS jetstream.JetStream
	// PG is read for the registry and the unregistered sensors tracked (unregistered.go).
	PG         *pgxpool.Pool
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Tracer, when set, traces each reading's append (trace.go); nil: no tracing at all.
	Tracer trace.Tracer
}

// Bridge moves readings from RabbitMQ to READINGS.
type Bridge struct {
	cfg Config
	js  jetstream.JetStream
	log *slog.Logger
	m   metrics
	// skew counts readings whose sensor clock is off (clock.go).
	skew   *clockSkew
	tracer trace.Tracer
	// sensors decides which sensors are tracked (unregistered.go).
	sensors *sensors
	// lastRetryLog is only touched by the acker goroutine.
	lastRetryLog time.Time
}

// New checks cfg and deps and builds a bridge; nothing is dialled until Run.
func New(cfg Config, deps Deps) (*Bridge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("bridge", part.Dep{Name: "JS", Value: deps.JS}, part.Dep{Name: "PG", Value: deps.PG},
		part.Dep{Name: "Logger", Value: deps.Logger}, part.Dep{Name: "Registerer", Value: deps.Registerer}); err != nil {
		return nil, err
	}
	js, err := jetstream.New(deps.JS.Conn(),
		// Our own bound (MaxInFlight) is the one that matters; this one only must not bite first.
		jetstream.WithPublishAsyncMaxPending(2*cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("bridge: JetStream: %w", err)
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	skew, err := newClockSkew(cfg.ClockSkewMax, deps.Registerer)
	if err != nil {
		return nil, err
	}
	log := deps.Logger.With("part", "bridge")
	sensors, err := newSensors(cfg, deps.PG, log, deps.Registerer)
	if err != nil {
		return nil, err
	}
	return &Bridge{cfg: cfg, js: js, log: log, m: m, skew: skew, tracer: deps.Tracer, sensors: sensors}, nil
}

// errSessionFailed ends the spans of the readings a failed session will not resolve: RabbitMQ
// redelivers them to the next one.
var errSessionFailed = errors.New("the session failed before this reading was resolved")

// errStandby: another bridge is the queue's consumer.
var errStandby = errors.New("another bridge consumes the queue")

// Run consumes until ctx is done, reconnecting to RabbitMQ with backoff, or standing by while
// another bridge consumes the queue. It returns nil after a clean stop.
func (b *Bridge) Run(ctx context.Context) error {
	wait := backoff.New(b.cfg.ReconnectMin, b.cfg.ReconnectMax)
	standby := false
	for {
		start := time.Now()
		err := b.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		// A session that lasted was healthy: the next failure starts the backoff afresh.
		if time.Since(start) > time.Minute {
			wait.Reset()
		}
		if errors.Is(err, errStandby) {
			if !standby {
				b.log.Info("another bridge consumes the queue; standing by to take over", "queue", b.cfg.Queue, "poll", b.cfg.StandbyPoll)
			}
			standby = true
			b.m.standby.Set(1)
			wait.Reset()
			if !backoff.Sleep(ctx, b.cfg.StandbyPoll) {
				return nil
			}
			continue
		}
		standby = false
		b.log.Warn("RabbitMQ session ended; reconnecting", "err", err, "backoff", wait.Delay())
		if !wait.Wait(ctx) {
			return nil
		}
	}
}
