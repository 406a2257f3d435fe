package state

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/projector/rebuild"
)

// Projection is the state projection as the rebuild runner sees it (rebuild.Projection).
type Projection struct {
	// Rebuilds is the template of the rebuilds' configuration (FromSeq and Progress are set
	// per rebuild).
	Rebuilds RebuildConfig
	Deps     RebuildDeps
}

// Name is "state".
func (Projection) Name() string { return Name }

// Rebuild prepares a rebuild of the state projection.
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

// Infos lists the state projection's checkpoints and, while a rebuild's shadow has
// checkpoints, the shadow's. The lag of a partition is counted by the server from its
// per-subject index (rebuild.PartitionLag), exact and without reading the messages.
func (p Projection) Infos(ctx context.Context, readings jetstream.Stream, partitionCount int) ([]rebuild.Info, error) {
	var out []rebuild.Info
	for _, name := range []string{Name, ShadowName} {
		cps, err := readCheckpoints(ctx, p.Deps.PG, name, false)
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
