package notifier

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lock-sensors/lock-sensors/internal/clock"
	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// Config is the notifier's configuration; zero tuning fields take their defaults, which are
// declared beside the loop that uses them (ingest.go, dispatch.go, endpoints.go, retention.go).
type Config struct {
	// PartitionCount is the number of EVENTS partitions (LOCKS_PARTITIONS).
	PartitionCount int
	// Partitions of EVENTS this process ingests; empty: its share of them, assigned and taken
	// over through leases (internal/lease). Sending is shared by every notifier process
	// through the delivery table.
	Partitions partition.Set
	// Owner names this process in the leases and the fence (lease.NewOwner by default).
	Owner string
	// LeaseTTL is how long a lease lives without renewal (lease.TTLDefault by default).
	LeaseTTL time.Duration
	// RetrySchedule lists the delays before attempts 2, 3, … (LOCKS_RETRY_SCHEDULE); empty
	// means one attempt and no retry.
	RetrySchedule []time.Duration
	// WebhookTimeout bounds one attempt (LOCKS_WEBHOOK_TIMEOUT); it is required.
	WebhookTimeout time.Duration
	// LeaseMargin is how long a delivery's lease outlasts WebhookTimeout
	// (LOCKS_WEBHOOK_LEASE_MARGIN, LeaseMarginDefault when zero; at least leaseMargin).
	LeaseMargin time.Duration
	// WebhookAllowPrivate allows loopback and private targets (LOCKS_WEBHOOK_ALLOW_PRIVATE).
	WebhookAllowPrivate bool

	// Batch is how many rows one claim, ingest or finish transaction handles (BatchDefault).
	Batch int
	// MaxInFlight bounds this process's concurrent attempts (MaxInFlightDefault).
	MaxInFlight int
	// PollInterval is the longest the dispatcher sleeps when it knows of nothing due: how
	// soon a row written by another process is noticed (PollIntervalDefault).
	PollInterval time.Duration
	// PerEndpoint is where one client's adaptive limit of concurrent attempts in this process
	// starts (PerEndpointDefault).
	PerEndpoint int
	// BreakerThreshold consecutive failures open a client's circuit (BreakerThresholdDefault).
	BreakerThreshold int
	// BreakerCooldown is how long an open circuit waits before a probe (BreakerCooldownDefault),
	// doubling while probes fail, up to BreakerMaxCooldown (BreakerMaxCooldownDefault).
	BreakerCooldown    time.Duration
	BreakerMaxCooldown time.Duration
	// DeadRetention keeps dead rows not redriven this long (DeadRetentionDefault);
	// KeepUntilRedriven keeps them until an operator redrives them.
	DeadRetention time.Duration
	// Retention keeps finished rows (delivered, cancelled, superseded) this long (RetentionDefault).
	Retention time.Duration
	// DisableAfter disables a client whose attempts all failed for this long
	// (LOCKS_ENDPOINT_DISABLE_AFTER, DisableAfterDefault there); zero never disables.
	DisableAfter time.Duration
	// MetricsMaxClients clients get their own label in the per-client metrics, the rest are
	// summed under client="other" (MetricsMaxClientsDefault).
	MetricsMaxClients int
}

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Batch, BatchDefault)
	def(&c.MaxInFlight, MaxInFlightDefault)
	def(&c.PerEndpoint, PerEndpointDefault)
	def(&c.BreakerThreshold, BreakerThresholdDefault)
	def(&c.MetricsMaxClients, MetricsMaxClientsDefault)
	defD(&c.PollInterval, PollIntervalDefault)
	defD(&c.LeaseMargin, LeaseMarginDefault)
	defD(&c.BreakerCooldown, BreakerCooldownDefault)
	defD(&c.BreakerMaxCooldown, BreakerMaxCooldownDefault)
	defD(&c.Retention, RetentionDefault)
	if c.DeadRetention == 0 {
		c.DeadRetention = DeadRetentionDefault
	}
	defD(&c.LeaseTTL, lease.TTLDefault)
	c.BreakerMaxCooldown = max(c.BreakerMaxCooldown, c.BreakerCooldown)
}

// Validate reports the first wrong field.
func (c Config) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("notifier: partitions must be >= 1, got %d", c.PartitionCount)
	case c.WebhookTimeout <= 0:
		return fmt.Errorf("notifier: webhook timeout must be positive, got %s", c.WebhookTimeout)
	case c.LeaseMargin < leaseMargin:
		return fmt.Errorf("notifier: lease margin must be at least %s, got %s", leaseMargin, c.LeaseMargin)
	case c.DisableAfter < 0:
		return fmt.Errorf("notifier: disable-after must be zero (never) or positive, got %s", c.DisableAfter)
	}
	for _, s := range c.RetrySchedule {
		if s <= 0 {
			return fmt.Errorf("notifier: retry schedule has a non-positive delay %s", s)
		}
	}
	for _, p := range c.Partitions {
		if p < 0 || p >= c.PartitionCount {
			return fmt.Errorf("notifier: partition %d is not one of the %d", p, c.PartitionCount)
		}
	}
	return nil
}

// Deps are what the notifier is built from.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	PG         *pgxpool.Pool
	// Tracer, when set, traces each webhook attempt (trace.go); nil: no tracing at all.
	Tracer trace.Tracer
	// Clock is the time of the retry and breaker decisions; nil is the system clock.
	Clock clock.Clock
}
