package history

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/lock-sensors/lock-sensors/internal/partition"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// CrashAfterInsert is the crash point between a batch's INSERT and the acks of its
// messages: a process killed there leaves rows in ClickHouse whose messages come back, which
// the ReplacingMergeTree tables and the collapsing queries must absorb.
const CrashAfterInsert = "history.after_insert"

// CrashAfterPosition is the crash point between the INSERT of a batch's positions
// (positions.go) and the acks of its messages: a process killed there must resume after the
// positions, not where the consumers' acks stood.
const CrashAfterPosition = "history.after_position"

// Defaults of Config.
const (
	BatchSizeDefault     = 10_000
	FlushIntervalDefault = time.Second
	// AckWaitDefault is raised to 3 × FlushInterval when that is longer.
	AckWaitDefault       = 60 * time.Second
	InsertTimeoutDefault = 30 * time.Second
	BackoffMinDefault    = 200 * time.Millisecond
	BackoffMaxDefault    = 10 * time.Second
	// DurableDefault prefixes the history projector's consumer names.
	DurableDefault       = "history"
	ShutdownGraceDefault = 10 * time.Second
)

// Config configures the history projector. Zero fields take the defaults.
type Config struct {
	// Partitions are the READINGS and EVENTS partitions this process writes.
	Partitions partition.Set
	// PartitionCount is LOCKS_PARTITIONS, against which message subjects are checked (0:
	// only the sensor of a subject is checked, not its partition number).
	PartitionCount int
	// BatchSize is the number of rows buffered per table before an INSERT (default 10,000).
	BatchSize int
	// FlushInterval is the age of the oldest buffered row at which the buffer is written even
	// if not full (default 1 s; up to minutes for a few large parts).
	FlushInterval time.Duration
	// AckWait is how long JetStream waits for an ack before redelivering (default 60 s, at
	// least 3 × FlushInterval). Buffered messages are kept alive with InProgress while an
	// INSERT waits or retries, so this only bounds how soon a crashed writer's messages return.
	AckWait time.Duration
	// MaxAckPending is the unacked messages per consumer (default 2 × BatchSize; never below BatchSize).
	MaxAckPending int
	// InsertTimeout bounds one INSERT attempt (default 30 s).
	InsertTimeout time.Duration
	// BackoffMin and BackoffMax bound the growing delay between failed INSERTs (200 ms, 10 s).
	BackoffMin, BackoffMax time.Duration
	// Durable prefixes the consumer names (default "history").
	Durable string
	// ShutdownGrace bounds the last flush after the context is cancelled (default 10 s).
	ShutdownGrace time.Duration
	// Retention drops months of history that ended longer ago than this
	// (LOCKS_HISTORY_RETENTION; 0 keeps everything), checked every RetentionEvery
	// (RetentionEveryDefault).
	Retention, RetentionEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = FlushIntervalDefault
	}
	if c.AckWait == 0 {
		c.AckWait = max(AckWaitDefault, 3*c.FlushInterval)
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 2 * c.BatchSize
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = InsertTimeoutDefault
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = BackoffMinDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = BackoffMaxDefault
	}
	if c.Durable == "" {
		c.Durable = DurableDefault
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = ShutdownGraceDefault
	}
	if c.RetentionEvery == 0 {
		c.RetentionEvery = RetentionEveryDefault
	}
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	switch {
	case len(c.Partitions) == 0:
		return errors.New("history: no partitions to write")
	case c.BatchSize < 1:
		return fmt.Errorf("history: batch size %d must be >= 1", c.BatchSize)
	case c.FlushInterval <= 0:
		return fmt.Errorf("history: flush interval %s must be positive", c.FlushInterval)
	case c.AckWait < time.Second:
		return fmt.Errorf("history: ack wait %s must be >= 1s", c.AckWait)
	case c.MaxAckPending < c.BatchSize:
		return fmt.Errorf("history: max ack pending %d must be >= batch size %d, or a batch never fills", c.MaxAckPending, c.BatchSize)
	case c.Retention < 0 || c.RetentionEvery < 0:
		return errors.New("history: retention must not be negative")
	case c.InsertTimeout <= 0 || c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return errors.New("history: insert timeout and backoff must be positive, BackoffMax >= BackoffMin")
	}
	for _, p := range c.Partitions {
		if p < 0 {
			return fmt.Errorf("history: partition %d < 0", p)
		}
	}
	return nil
}

// Deps are what the history projector runs on.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	JS         jetstream.JetStream
	CH         driver.Conn
}
