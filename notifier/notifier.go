package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/logread"
	"github.com/lock-sensors/lock-sensors/internal/outbox"
	"github.com/lock-sensors/lock-sensors/internal/part"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
	"github.com/lock-sensors/lock-sensors/internal/stage"
)

// Crash points, for tests that kill the notifier at its worst moments.
const (
	// CrashAfterIngestCommit: deliveries committed, EVENTS messages not acknowledged.
	CrashAfterIngestCommit = "notifier.after_ingest_commit"
	// CrashAfterSetAsideRun: a batch all set aside and acked, the position after it not written.
	CrashAfterSetAsideRun = "notifier.after_set_aside_run"
	// CrashAfterFinishCommit: attempt outcomes (and next attempt times) committed, records not relayed.
	CrashAfterFinishCommit = "notifier.after_finish_commit"
)

// Name is the notifier's name in the partition leases (leases_notifier) and the fence rows.
const Name = "notifier"

// Notifier consumes EVENTS and delivers webhooks. Its loops, one per file: ingest (EVENTS
// → delivery rows), dispatch (claims → attempts), attempt (one webhook), finisher (outcomes
// → rows and the attempt outbox), relay (attempt outbox → DELIVERIES), janitor (sweeps).
type Notifier struct {
	cfg    Config
	js     jetstream.JetStream
	db     *pgxpool.Pool
	log    *slog.Logger
	clock  clock.Clock
	policy Policy
	lease  time.Duration
	send   *sender
	ep     *endpoints
	m      metrics
	relay  *outbox.Relay
	// leases gives this process its EVENTS partitions to ingest (the fixed ones, or its share).
	leases *lease.Assigner
	// setAside records the EVENTS messages that are not real events (see checkBatch).
	setAside *setaside.Recorder

	inflight atomic.Int64
	results  chan result
	wake     chan struct{}  // the dispatcher: something may be due
	handoff  chan []claimed // rows leased at intake, for the dispatcher to attempt (handoff.go)
	// dispatching is true while dispatch runs: the intake leases rows only then.
	dispatching atomic.Bool
	slotFreed   chan struct{}
	ran         atomic.Bool
	gaps        *logread.Gaps
	tracer      trace.Tracer // nil: no tracing (trace.go)
}

type metrics struct {
	events   prometheus.Counter
	created  prometheus.Counter
	outcomes *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	lag      prometheus.Histogram
	inflight prometheus.GaugeFunc
	breaker  prometheus.Counter
	resets   prometheus.Counter
	late     prometheus.Counter
	// intakeLeased counts deliveries leased at intake and handed to the dispatcher.
	intakeLeased prometheus.Counter
	clients      *clientMetrics
	// This part's hops of locks_stage_seconds.
	intake, claim, attempt, finish stage.Observer
}

// New builds a notifier.
func New(cfg Config, d Deps) (*Notifier, error) {
	if err := part.Require("notifier", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer},
		part.Dep{Name: "JS", Value: d.JS}, part.Dep{Name: "PG", Value: d.PG}); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Notifier{
		cfg: cfg, js: d.JS, db: d.PG, log: d.Logger.With("part", "notifier"), clock: clock.Or(d.Clock),
		policy:    Policy{Schedule: append([]time.Duration(nil), cfg.RetrySchedule...)},
		lease:     cfg.WebhookTimeout + cfg.LeaseMargin,
		send:      newSender(cfg.WebhookTimeout, cfg.WebhookAllowPrivate),
		ep:        newEndpoints(cfg.PerEndpoint, cfg.BreakerThreshold, cfg.BreakerCooldown, cfg.BreakerMaxCooldown),
		results:   make(chan result, 2*cfg.MaxInFlight),
		wake:      make(chan struct{}, 1),
		slotFreed: make(chan struct{}, 1),
		handoff:   make(chan []claimed),
		tracer:    d.Tracer,
	}
	n.m = metrics{
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_events_total",
			Help: "EVENTS messages consumed by the notifier."}),
		created: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_deliveries_created_total",
			Help: "Deliveries created (one per event and subscribed client)."}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "locks_notifier_attempts_total",
			Help: "Webhook attempts recorded, by outcome (delivered, retry, dead, cancelled, superseded)."}, []string{"outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "locks_notifier_attempt_duration_seconds",
			Help:    "Duration of webhook HTTP attempts, by result (2xx, 3xx, 4xx, 5xx, error).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"result"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "locks_notifier_delivery_lag_seconds",
			Help:    "From an event's occurred_at to its successful delivery.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 16)}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "locks_notifier_inflight_attempts",
			Help: "Webhook attempts in flight in this process."}, func() float64 { return float64(n.inflight.Load()) }),
		breaker: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_breaker_opened_total",
			Help: "Times a client's circuit breaker opened."}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_endpoint_resets_total",
			Help: "Endpoint resets (an operator's redrive, resend or re-enable) received over NATS."}),
		late: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_late_events_total",
			Help: "Events taken in after a newer revision of the same sensor for the same client (recorded superseded, never sent): should stay 0."}),
		intakeLeased: prometheus.NewCounter(prometheus.CounterOpts{Name: "locks_notifier_leased_at_intake_total",
			Help: "Deliveries leased by the intake transaction that created them and handed to the dispatcher without a claim."}),
		clients: newClientMetrics(cfg.MetricsMaxClients),
	}
	if err := part.Register(d.Registerer, "notifier", append([]prometheus.Collector{n.m.events, n.m.created, n.m.outcomes, n.m.latency,
		n.m.lag, n.m.inflight, n.m.breaker, n.m.resets, n.m.late, n.m.intakeLeased}, n.m.clients.collectors()...)...); err != nil {
		return nil, err
	}
	var err error
	if n.gaps, err = logread.NewGaps(d.Registerer, n.log, Name); err != nil {
		return nil, err
	}
	for _, s := range []struct {
		o    *stage.Observer
		name string
	}{{&n.m.intake, stage.Intake}, {&n.m.claim, stage.Claim}, {&n.m.attempt, stage.Attempt}, {&n.m.finish, stage.Finish}} {
		if *s.o, err = stage.New(d.Registerer, s.name); err != nil {
			return nil, err
		}
	}
	if n.setAside, err = setaside.NewRecorder(SetAsideConsumer, d.JS, n.log, d.Registerer); err != nil {
		return nil, err
	}
	if n.relay, err = newAttemptRelay(cfg, d); err != nil {
		return nil, err
	}
	if n.leases, err = lease.New(lease.Config{Name: Name, PartitionCount: cfg.PartitionCount, Partitions: cfg.Partitions,
		Owner: cfg.Owner, TTL: cfg.LeaseTTL}, lease.Deps{Logger: n.log, Registerer: d.Registerer, JS: d.JS, PG: d.PG, Clock: d.Clock}); err != nil {
		return nil, err
	}
	return n, nil
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run consumes EVENTS and sends webhooks until ctx is done; then it stops claiming, aborts
// the attempts in flight (their leases are released, they are not counted), writes the
// outcomes it has and relays the records. It can be called once.
//
// Stop order: dispatch ends (its attempts done) → results closed → the finisher has written
// every outcome → the relay makes its last round; ingest and the janitor stop with ctx.
// Ingest runs on the partitions the leases give this process; an error of theirs (not a
// fenced partition, which the assigner handles) stops the notifier and is returned.
func (n *Notifier) Run(ctx context.Context) error {
	if !n.ran.CompareAndSwap(false, true) {
		return errors.New("notifier: Run called twice")
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRelay()
	if err := n.listenResets(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var ingestErr error
	wg.Go(func() {
		if ingestErr = n.leases.Run(ctx, n.ingest); ingestErr != nil {
			stop()
		}
	})
	wg.Go(func() { n.janitor(ctx) })
	wg.Go(func() { _ = n.relay.Run(relayCtx) })
	wg.Go(func() {
		n.finisher()
		stopRelay()
	})
	wg.Go(func() {
		n.dispatch(ctx)
		close(n.results)
	})
	wg.Wait()
	if ingestErr != nil && !errors.Is(ingestErr, context.Canceled) {
		return fmt.Errorf("notifier ingest: %w", ingestErr)
	}
	n.log.Info("notifier stopped")
	return nil
}

// count adds attempt records to the outcome metric.
func (n *Notifier) count(recs []event.Attempt) {
	for _, a := range recs {
		n.m.outcomes.WithLabelValues(a.Outcome).Inc()
	}
	n.m.clients.count(recs)
}
