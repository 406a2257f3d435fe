package state

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/rebuild"
)

// NewProjection is the state projection as the rebuild runner sees it: each rebuild is one
// of rebuilds (the template of their configuration) on deps, started where the runner says.
func NewProjection(rebuilds RebuildConfig, deps RebuildDeps) rebuild.Projection {
	return rebuild.Adapter[*Rebuild]{
		ProjectionName: Name,
		New: func(s rebuild.Start) (*Rebuild, error) {
			c, d := rebuilds, deps
			c.FromSeq, c.Progress, d.Logger = s.FromSeq, s.Progress, s.Logger
			return NewRebuild(c, d)
		},
		List: func(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
			return infos(ctx, deps.PG, readings, partitionCount)
		},
	}
}

// infos lists the state projection's checkpoints and, while a rebuild's shadow has
// checkpoints, the shadow's. The lag of a partition is counted by the server from its
// per-subject index (rebuild.PartitionLag), exact and without reading the messages.
func infos(ctx context.Context, pg querier, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
	var out []rebuild.Info
	for _, name := range []string{Name, ShadowName} {
		cps, err := readCheckpoints(ctx, pg, name, false)
		if err != nil {
			return nil, err
		}
		if name == ShadowName && len(cps) == 0 {
			continue
		}
		info := rebuild.Info{Name: name}
		for pt := range partitionCount {
			part := rebuild.PartitionInfo{Partition: pt, Checkpoint: cps[pt].seq}
			if part.Lag, part.LastSeq, err = rebuild.PartitionLag(ctx, readings, pt, cps[pt].seq); err != nil {
				return nil, err
			}
			info.Partitions = append(info.Partitions, part)
			info.Lag += part.Lag
		}
		out = append(out, info)
	}
	return out, nil
}
