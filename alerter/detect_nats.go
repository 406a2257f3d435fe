package alerter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/procs"
	"github.com/lock-sensors/lock-sensors/internal/setaside"
)

// setAside: records were set aside by a consumer (subject setaside.<consumer>); resolved
// after SetAsideQuiet without a new one. The alert's watermark is the last record's
// sequence, so every record is alerted even if the alerter was down past the quiet time.
func (a *Alerter) setAside(ctx context.Context) (map[string]condition, error) {
	st, err := a.d.JS.Stream(ctx, natsx.SetAsideStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.SetAsideStream, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(natsx.SetAsideSubject(">")))
	if err != nil {
		return nil, fmt.Errorf("%s subjects: %w", natsx.SetAsideStream, err)
	}
	out := map[string]condition{}
	for subject, n := range info.State.Subjects {
		consumer := strings.TrimPrefix(subject, natsx.SetAsideSubject(""))
		m, err := st.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("last record of %s: %w", subject, err)
		}
		var rec setaside.Record
		_ = json.Unmarshal(m.Data, &rec) // a record that does not decode still counts
		key := "consumer/" + consumer
		mark, err := a.lastWatermark(ctx, KindSetAside, key)
		if err != nil {
			return nil, err
		}
		if !setAsideFiring(int64(m.Sequence), mark, m.Time, a.d.Clock.Now(), a.cfg.SetAsideQuiet) {
			continue
		}
		out[key] = condition{
			summary: fmt.Sprintf("%s set aside a log message it can never apply (last: %s, %s seq %d); GET /v1/set-aside lists them",
				consumer, rec.Reason, rec.Stream, rec.StreamSeq),
			details: map[string]any{"consumer": consumer, "records_kept": n, "last_record_seq": m.Sequence, "last_record_at": m.Time.UTC(),
				"last_reason": rec.Reason, "last_detail": rec.Detail, "last_stream": rec.Stream, "last_stream_seq": rec.StreamSeq},
			watermark: int64(m.Sequence),
		}
	}
	return out, nil
}

// partStopped: a process's registry entry was not updated for ProcessStale (a clean stop
// deletes it); resolved when it reports again, its entry goes, or a process on the same
// host that reports now runs every part it ran (it was restarted).
func (a *Alerter) partStopped(ctx context.Context) (map[string]condition, error) {
	ps, err := procs.List(ctx, a.d.JS)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string]condition{}, nil // no process has registered yet
	}
	if err != nil {
		return nil, fmt.Errorf("process registry: %w", err)
	}
	out := map[string]condition{}
	for _, p := range stoppedProcesses(ps, a.d.Clock.Now(), a.cfg.ProcessStale) {
		out["process/"+p.ID] = condition{
			summary: fmt.Sprintf("process %s on %s (pid %d, parts %s) stopped reporting at %s",
				p.ID, p.Host, p.PID, strings.Join(p.Parts, ","), p.UpdatedAt.UTC().Format(time.RFC3339)),
			details: map[string]any{"process": p.ID, "host": p.Host, "pid": p.PID, "parts": p.Parts, "version": p.Version,
				"last_report_at": p.UpdatedAt.UTC(), "http_addr": p.HTTPAddr},
		}
	}
	return out, nil
}

// projectionLag: a partition of a projection whose oldest unapplied reading is older than
// Lag (behind, or stuck with messages pending), from the same listing as the admin API's
// ListProjections; resolved when it catches up.
func (a *Alerter) projectionLag(ctx context.Context) (map[string]condition, error) {
	infos, err := a.d.Projections.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list projections: %w", err)
	}
	st, err := a.d.JS.Stream(ctx, natsx.ReadingsStream)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", natsx.ReadingsStream, err)
	}
	out := map[string]condition{}
	for _, in := range infos {
		if !slices.Contains(a.cfg.LagProjections, in.Name) {
			continue
		}
		for _, p := range in.Partitions {
			if p.Lag == 0 {
				continue
			}
			// The partition's first message after the checkpoint: how long it has waited.
			m, err := st.GetMsg(ctx, p.Checkpoint+1, jetstream.WithGetMsgSubject(natsx.ReadingsPartitionFilter(p.Partition)))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // applied meanwhile
			}
			if err != nil {
				return nil, fmt.Errorf("oldest unapplied reading of %s partition %d: %w", in.Name, p.Partition, err)
			}
			age := a.d.Clock.Now().Sub(m.Time)
			if age < a.cfg.Lag {
				continue
			}
			out[in.Name+"/"+strconv.Itoa(p.Partition)] = condition{
				summary: fmt.Sprintf("projection %s partition %d is %d readings behind; the oldest waits for %s (threshold %s)",
					in.Name, p.Partition, p.Lag, age.Round(time.Second), a.cfg.Lag),
				details: map[string]any{"projection": in.Name, "partition": p.Partition, "lag": p.Lag, "checkpoint": p.Checkpoint,
					"last_seq": p.LastSeq, "oldest_unapplied_at": m.Time.UTC()},
			}
		}
	}
	return out, nil
}
