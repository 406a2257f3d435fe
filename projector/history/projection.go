package history

import (
	"context"
	"errors"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
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
		List: func(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
			return infos(ctx, deps.CH, readings, partitionCount)
		},
	}
}

// infos lists the history projection: per partition, the position of its READINGS consumer
// (of the default name) in ClickHouse is its checkpoint (0 when it has none, or one of
// another stream, which the projector reads again from the start). The lag is the live
// consumer's num_pending plus num_ack_pending (one cheap look-up, as the alerter asks
// often), or while there is none, the partition's messages after the checkpoint.
//
// With a live consumer, a partition's last sequence is read first, its consumer next and the
// positions last: the projector writes a batch's positions before it acks the batch's
// messages, so a consumer with nothing pending means a checkpoint, read after it, at least at
// the last sequence read before it. Read in another order, a batch written or a reading
// appended between the reads showed no lag with a checkpoint short of the last sequence.
func infos(ctx context.Context, ch driver.Conn, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
	names := make([]string, partitionCount)
	live := make([]*jetstream.ConsumerInfo, partitionCount) // nil: no live consumer
	last := make([]uint64, partitionCount)
	for pt := range partitionCount {
		names[pt] = readingsConsumer(DurableDefault, pt)
		var err error
		if last[pt], err = rebuild.PartitionLastSeq(ctx, readings, pt); err != nil {
			return nil, err
		}
		cons, err := readings.Consumer(ctx, names[pt])
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
		case err != nil:
			return nil, fmt.Errorf("history consumer of partition %d: %w", pt, err)
		default:
			live[pt] = cons.CachedInfo()
		}
	}
	ps, err := readPositions(ctx, ch, names)
	if err != nil {
		return nil, err
	}
	id := natsx.StreamIdentity(readings.CachedInfo())
	info := rebuild.Info{Name: Name}
	for pt := range partitionCount {
		part := rebuild.PartitionInfo{Partition: pt}
		if p := ps[names[pt]]; p.stream == id {
			part.Checkpoint = p.seq
		}
		if ci := live[pt]; ci == nil {
			if part.Lag, part.LastSeq, err = rebuild.PartitionLag(ctx, readings, pt, part.Checkpoint); err != nil {
				return nil, err
			}
		} else {
			part.Lag, part.LastSeq = ci.NumPending+uint64(ci.NumAckPending), last[pt]
		}
		info.Partitions = append(info.Partitions, part)
		info.Lag += part.Lag
	}
	return []rebuild.Info{info}, nil
}
