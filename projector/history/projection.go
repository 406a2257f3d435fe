package history

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// NewProjection is the history projection as the rebuild runner sees it: each rebuild is
// one of rebuilds (the template of their configuration) on deps, started where the runner
// says.
func NewProjection(rebuilds RebuildConfig, deps RebuildDeps) rebuild.Projection {
	return rebuild.Adapter[*Rebuild]{
		ProjectionName: Name,
		New: func(s rebuild.Start) (*Rebuild, error) {
			c, d := rebuilds, deps
			c.FromSeq, c.Progress, d.Logger = s.FromSeq, s.Progress, s.Logger
			return NewRebuild(c, d)
		},
		List: infos,
	}
}

// infos lists the history projection. It keeps no checkpoint of its own: the ack floor of
// its READINGS durable consumers (of the default name) is its checkpoint, and their
// num_pending plus num_ack_pending its lag.
func infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
	info := rebuild.Info{Name: Name}
	for pt := range partitionCount {
		part := rebuild.PartitionInfo{Partition: pt}
		cons, err := readings.Consumer(ctx, readingsConsumer(DurableDefault, pt))
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
