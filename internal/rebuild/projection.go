package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var (
	// ErrRunning: a rebuild of the projection is under way already.
	ErrRunning = errors.New("a rebuild of this projection is running")
	// ErrUnknownProjection: no Projection of the runner has the name.
	ErrUnknownProjection = errors.New("unknown projection")
	// ErrNoReadingAfter: READINGS holds no message at or after the time asked for.
	ErrNoReadingAfter = errors.New("READINGS holds no message at or after that time")
)

// Start is how the runner starts a rebuild: at READINGS sequence FromSeq (0: the start),
// reporting to Progress, logging to Logger.
type Start struct {
	FromSeq  uint64
	Progress func(Progress)
	Logger   *slog.Logger
}

// Projection is a projection the runner can rebuild and list.
type Projection interface {
	// Name is the projection's name in requests ("state", "history").
	Name() string
	// Rebuild prepares a rebuild as s says; the returned function runs it.
	Rebuild(s Start) (func(context.Context) (Result, error), error)
	// Infos lists the projection's partitions (and those of what it keeps beside, such as a
	// rebuild's shadow), readings being the READINGS stream.
	Infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]Info, error)
}

// Rebuilder is one rebuild of a projection, made for one run.
type Rebuilder interface {
	Run(ctx context.Context) (Result, error)
}

// Adapter is the Projection of every projection: the one named ProjectionName, whose
// rebuilds New makes and whose partitions List lists.
type Adapter[R Rebuilder] struct {
	ProjectionName string
	New            func(Start) (R, error)
	List           func(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]Info, error)
}

// Name is ProjectionName.
func (a Adapter[R]) Name() string { return a.ProjectionName }

// Rebuild makes a rebuild with New and returns its Run.
func (a Adapter[R]) Rebuild(s Start) (func(context.Context) (Result, error), error) {
	r, err := a.New(s)
	if err != nil {
		return nil, err
	}
	return r.Run, nil
}

// Infos is List.
func (a Adapter[R]) Infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]Info, error) {
	return a.List(ctx, readings, partitionCount)
}

// Request asks for a rebuild of Projection from FromSeq, or from the first READINGS message
// at or after FromTime (not both).
type Request struct {
	Projection string
	FromSeq    uint64
	FromTime   time.Time
}

// Status is a rebuild started by the runner: under way or the last one.
type Status struct {
	Projection string
	Running    bool
	// Phase is "starting" (before the first progress report), "catch-up", "swap", "done"
	// or "failed".
	Phase       string
	Done, Total uint64  // READINGS (history: all three streams') messages
	Rate        float64 // messages/s since the start
	ETA         time.Duration
	FromSeq     uint64 // the READINGS sequence it starts at (0: the beginning)
	Started     time.Time
	Finished    time.Time // zero while running
	Err         string    // why it failed
	Result      Result
}

// PartitionInfo is one partition of a projection: the READINGS sequence it has applied up
// to (Checkpoint), the partition's last sequence in READINGS, and Lag, the number of the
// partition's messages after the checkpoint.
type PartitionInfo struct {
	Partition  int
	Checkpoint uint64
	LastSeq    uint64
	Lag        uint64
}

// Info is a projection's checkpoints and lag per partition, and its rebuild (running or
// last) when one was started by the runner listing it.
type Info struct {
	Name       string
	Partitions []PartitionInfo
	Lag        uint64 // the sum of the partitions'
	Rebuild    *Status
}
