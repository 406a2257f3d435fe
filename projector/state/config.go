package state

import (
	"errors"
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

// Name is the checkpoint name of the state projector.
const Name = "state"

// Crash points of the state projector and its relay (see internal/crashpoint).
const (
	CrashAfterCommit       = "state.after_commit"
	CrashRelayAfterPublish = "relay.after_publish"
)

// Defaults of Config.
const (
	BatchSizeDefault      = 1000
	AckWaitDefault        = 2 * time.Minute
	IdleWaitDefault       = time.Second
	RelayPollDefault      = 2 * time.Second
	RelayBatchDefault     = 1000
	PublishTimeoutDefault = 10 * time.Second
	CacheSensorsDefault   = 100_000
	// SeenIntervalDefault is LOCKS_STATE_SEEN_INTERVAL's default; Config.SeenInterval's zero
	// value writes every reading, as before coalescing.
	SeenIntervalDefault = 5 * time.Second
)

// Config configures the state projector and its outbox relay.
type Config struct {
	// Partitions are the READINGS partitions this process owns; empty: its share of them,
	// assigned and taken over through leases (internal/lease).
	Partitions partition.Set
	// Owner names this process in the leases and the fence (lease.NewOwner by default).
	Owner string
	// LeaseTTL is how long a lease lives without renewal (lease.TTLDefault by default).
	LeaseTTL time.Duration
	// PartitionCount is LOCKS_PARTITIONS, the number of partitions of READINGS.
	PartitionCount int
	// BatchSize is the most READINGS messages applied in one transaction.
	BatchSize int
	// AckWait is the consumers' ack wait: a batch is acked after its commit, so it must
	// exceed the slowest transaction.
	AckWait time.Duration
	// IdleWait is how long an idle partition waits for its next message before checking
	// its consumer.
	IdleWait time.Duration
	// RelayPoll is how often the relay looks at the outbox without a nudge: every commit of
	// this process nudges the relay of its partition at once; the poll is a safety net (rows
	// of an earlier owner of the partition are relayed at start).
	RelayPoll time.Duration
	// RelayBatch is the most outbox rows published per round.
	RelayBatch int
	// PublishTimeout bounds the wait for JetStream's ack of an event.
	PublishTimeout time.Duration
	// CacheSensors bounds the rows kept in memory per partition between batches (about 200
	// bytes each). A full cache is emptied and refilled.
	CacheSensors int
	// SeenInterval is how long a sensor's liveness (last_seen, last_reading_time, last_seq)
	// may wait in memory before it is written when nothing else of the sensor changed
	// (seen.go): a change of state, connection or revision is written at once. 0: every
	// reading writes its row.
	SeenInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.AckWait == 0 {
		c.AckWait = AckWaitDefault
	}
	if c.IdleWait == 0 {
		c.IdleWait = IdleWaitDefault
	}
	if c.RelayPoll == 0 {
		c.RelayPoll = RelayPollDefault
	}
	if c.RelayBatch == 0 {
		c.RelayBatch = RelayBatchDefault
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = PublishTimeoutDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = lease.TTLDefault
	}
	if c.CacheSensors == 0 {
		c.CacheSensors = CacheSensorsDefault
	}
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("state projector: partition count %d < 1", c.PartitionCount)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return fmt.Errorf("state projector: batch size %d not in 1..10000", c.BatchSize)
	case c.RelayBatch < 1:
		return fmt.Errorf("state projector: relay batch %d < 1", c.RelayBatch)
	case c.AckWait < time.Second:
		return fmt.Errorf("state projector: ack wait %s < 1s", c.AckWait)
	case c.IdleWait <= 0 || c.RelayPoll <= 0 || c.PublishTimeout <= 0:
		return errors.New("state projector: idle wait, relay poll and publish timeout must be > 0")
	case c.SeenInterval < 0 || c.SeenInterval > SeenIntervalMax:
		return fmt.Errorf("state projector: seen interval %s not in 0..%s", c.SeenInterval, SeenIntervalMax)
	}
	if err := c.Partitions.Check(c.PartitionCount); err != nil {
		return fmt.Errorf("state projector: %w", err)
	}
	return nil
}

// Deps are what the state projector runs on.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	PG         *pgxpool.Pool
	// Tracer, when set, traces each applied batch (trace.go); nil: no tracing at all.
	Tracer trace.Tracer
	// Clock times the coalesced liveness (when a sensor's pending last_seen is due) and
	// the partitions' leases; nil: the system clock.
	Clock clock.Clock
}

// candidates are the partitions this process may own: the fixed ones, or any.
func (c Config) candidates() partition.Set {
	if len(c.Partitions) > 0 {
		return c.Partitions
	}
	return partition.All(c.PartitionCount)
}
