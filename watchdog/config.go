package watchdog

import (
	"fmt"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/lease"
	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// Defaults of Config.
const (
	SweepEveryDefault     = 5 * time.Minute
	OverridesEveryDefault = 30 * time.Second
	HoldCheckEveryDefault = 200 * time.Millisecond
	ConcurrencyDefault    = 512
	// CatchUpGraceDefault covers a drained queue's last messages still on their way
	// through the bridge into READINGS.
	CatchUpGraceDefault = 2 * time.Second
	DurableDefault      = "watchdog"
	// MaxHoldDefault is a quarter of the default lost_after: a bridge restart or an ordinary
	// backlog drains well within it, and a sensor that really went silent during a longer
	// outage is then reported at most this much late, rather than never.
	MaxHoldDefault    = 15 * time.Minute
	PruneEveryDefault = time.Minute
)

// Config is what the watchdog needs besides its dependencies.
type Config struct {
	// PartitionCount is the partition count of READINGS (LOCKS_PARTITIONS).
	PartitionCount int
	// Partitions is the partitions this process watches; empty: its share of them, assigned
	// and taken over through leases (internal/lease).
	Partitions partition.Set
	// Owner names this process in the leases and the fence (lease.NewOwner by default).
	Owner string
	// LeaseTTL is how long a lease lives without renewal (lease.TTLDefault by default).
	LeaseTTL time.Duration
	// LostAfter is the default silence after which a sensor is lost (LOCKS_LOST_AFTER).
	LostAfter time.Duration
	// SweepEvery is the period of the reconciliation sweep.
	SweepEvery time.Duration
	// OverridesEvery is how often per-sensor lost_after overrides are reloaded.
	OverridesEvery time.Duration
	// HoldCheckEvery is how often held expiries are re-examined.
	HoldCheckEvery time.Duration
	// Concurrency bounds the expiries settled at once.
	Concurrency int
	// CatchUpGrace is how long the upstream must have been caught up after it was behind
	// before held expiries are declared.
	CatchUpGrace time.Duration
	// Durable is the prefix of the READINGS consumer names: one per partition, "<Durable>-<p>".
	Durable string
	// MaxHold bounds how long an expiry is held while the pipeline is behind; past it the
	// sensor is declared anyway (LOCKS_WATCHDOG_MAX_HOLD).
	MaxHold time.Duration
	// PruneEvery is how often the refresh deadlines that have passed are forgotten.
	PruneEvery time.Duration
	// PositionEvery is how often each partition's position (position.go) is written while
	// it moves: a restart re-applies at most about this much of READINGS.
	PositionEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.SweepEvery <= 0 {
		c.SweepEvery = SweepEveryDefault
	}
	if c.OverridesEvery <= 0 {
		c.OverridesEvery = OverridesEveryDefault
	}
	if c.HoldCheckEvery <= 0 {
		c.HoldCheckEvery = HoldCheckEveryDefault
	}
	if c.Concurrency <= 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.CatchUpGrace <= 0 {
		c.CatchUpGrace = CatchUpGraceDefault
	}
	if c.Durable == "" {
		c.Durable = DurableDefault
	}
	if c.MaxHold <= 0 {
		c.MaxHold = MaxHoldDefault
	}
	if c.PruneEvery <= 0 {
		c.PruneEvery = PruneEveryDefault
	}
	if c.PositionEvery <= 0 {
		c.PositionEvery = PositionEveryDefault
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = lease.TTLDefault
	}
}

// Validate reports the first unusable value.
func (c Config) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("watchdog: partition count must be >= 1, got %d", c.PartitionCount)
	case c.LostAfter < time.Second:
		// Per-message TTLs are whole seconds on the server.
		return fmt.Errorf("watchdog: lost_after must be >= 1s, got %s", c.LostAfter)
	}
	if err := c.Partitions.Check(c.PartitionCount); err != nil {
		return fmt.Errorf("watchdog: owned %w", err)
	}
	return nil
}
