package history

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/projector/rebuild"
)

// Projection is the history projection as the rebuild runner sees it (rebuild.Projection).
type Projection struct {
	// Durable is the history projector's consumer name prefix (default DurableDefault).
	Durable string
	// Rebuilds is the template of the rebuilds' configuration (FromSeq and Progress are set
	// per rebuild).
	Rebuilds RebuildConfig
	Deps     RebuildDeps
}

// Name is "history".
func (Projection) Name() string { return Name }

// Rebuild prepares a rebuild of the history projection.
func (p Projection) Rebuild(fromSeq uint64, progress func(rebuild.Progress), log *slog.Logger) (func(context.Context) (rebuild.Result, error), error) {
	c := p.Rebuilds
	c.FromSeq, c.Progress = fromSeq, progress
	d := p.Deps
	d.Logger = log
	r, err := NewRebuild(c, d)
	if err != nil {
		return nil, err
	}
	return r.Run, nil
}

// Infos lists the history projection. It keeps no checkpoint of its own: its READINGS
// durable consumers' ack floor is its checkpoint, and their num_pending plus
// num_ack_pending its lag.
func (p Projection) Infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
	durable := p.Durable
	if durable == "" {
		durable = DurableDefault
	}
	info := rebuild.Info{Name: Name}
	for pt := range partitionCount {
		part := rebuild.PartitionInfo{Partition: pt}
		cons, err := readings.Consumer(ctx, readingsConsumer(durable, pt))
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			// Never run: nothing applied.
			if part.Lag, part.LastSeq, err = rebuild.PartitionLag(ctx, readings, pt, 0); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, fmt.Errorf("history consumer of partition %d: %w", pt, err)
		default:
			ci := cons.CachedInfo()
			part.Checkpoint, part.Lag = ci.AckFloor.Stream, ci.NumPending+uint64(ci.NumAckPending)
			if part.LastSeq, err = rebuild.PartitionLastSeq(ctx, readings, pt); err != nil {
				return nil, err
			}
		}
		info.Partitions = append(info.Partitions, part)
		info.Lag += part.Lag
	}
	return []rebuild.Info{info}, nil
}
