package state

import (
	"errors"
	"fmt"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// RebuildConfig configures a rebuild of the state projection.
type RebuildConfig struct {
	// PartitionCount is LOCKS_PARTITIONS.
	PartitionCount int
	// FromSeq starts the rebuild at this READINGS sequence instead of 1. It is required when
	// the stream no longer starts at 1; the events of a rebuild that does not start at the
	// beginning get other revisions and will not match EVENTS.
	FromSeq uint64
	// BatchSize is the most READINGS messages per shadow transaction (default 5000).
	BatchSize int
	// SwapTail is how far (in stream sequences) the shadow may be behind the live checkpoint
	// of a partition when the swap transaction starts (default 20000): the tail is applied
	// while the live projector waits.
	SwapTail uint64
	// LockTimeout bounds the wait for the live tables' locks at the swap (default 30s).
	LockTimeout time.Duration
	// ProgressEvery is the period of Progress calls (default 1s).
	ProgressEvery time.Duration
	// Progress, when set, is called every ProgressEvery and once at the end; otherwise
	// progress is logged.
	Progress func(rebuild.Progress)
}

func (c *RebuildConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 5000
	}
	if c.SwapTail == 0 {
		c.SwapTail = 20000
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 30 * time.Second
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
}

// Validate reports the first bad field.
func (c RebuildConfig) Validate() error {
	switch {
	case c.PartitionCount < 1:
		return fmt.Errorf("rebuild: partition count %d < 1", c.PartitionCount)
	case c.BatchSize < 1 || c.BatchSize > 50000:
		return fmt.Errorf("rebuild: batch size %d not in 1..50000", c.BatchSize)
	case c.LockTimeout <= 0 || c.ProgressEvery <= 0:
		return errors.New("rebuild: lock timeout and progress period must be > 0")
	}
	return nil
}
