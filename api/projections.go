package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/rebuild"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// rebuildRunningType marks the FAILED_PRECONDITION of a rebuild already under way, which
// REST answers with 409 Conflict (a stale etag, the other FAILED_PRECONDITION, is 412).
const rebuildRunningType = "REBUILD_RUNNING"

// Projections is what the projection calls need of a rebuild controller: list the
// projections with their checkpoints, lag and rebuilds, and start a rebuild (in this
// process); the rebuild runner (projector/rebuild) is one. Start fails with rebuild.ErrRunning while a rebuild of the
// projection runs, and with rebuild.ErrNoReadingAfter when FromTime is past the log.
type Projections interface {
	List(ctx context.Context) ([]rebuild.Info, error)
	Start(ctx context.Context, req rebuild.Request) (rebuild.Status, error)
}

// projectionNames are the projections the API names (locksv1.RebuildProjectionRequest.name).
var projectionNames = []string{"state", "history"}

// projectionService lists the projections and starts their rebuilds through Deps.Projections;
// without one both calls answer UNIMPLEMENTED.
type projectionService struct {
	locksv1.UnimplementedProjectionServiceServer
	s *Server
}

func (ps *projectionService) runner() (Projections, error) {
	if ps.s.projections == nil {
		return nil, fmt.Errorf("%w: this server runs no rebuild runner, so it neither lists nor rebuilds projections", ErrUnimplemented)
	}
	return ps.s.projections, nil
}

func (ps *projectionService) ListProjections(ctx context.Context, _ *locksv1.ListProjectionsRequest) (*locksv1.ListProjectionsResponse, error) {
	r, err := ps.runner()
	if err != nil {
		return nil, err
	}
	infos, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &locksv1.ListProjectionsResponse{}
	for _, in := range infos {
		p := &locksv1.Projection{Name: in.Name, Lag: in.Lag}
		for _, part := range in.Partitions {
			p.Partitions = append(p.Partitions, &locksv1.ProjectionPartition{Partition: int32(part.Partition),
				Checkpoint: part.Checkpoint, LastSeq: part.LastSeq, Lag: part.Lag})
		}
		if in.Rebuild != nil {
			p.Rebuild = rebuildProto(*in.Rebuild)
		}
		out.Projections = append(out.Projections, p)
	}
	return out, nil
}

func (ps *projectionService) RebuildProjection(ctx context.Context, req *locksv1.RebuildProjectionRequest) (*locksv1.RebuildProjectionResponse, error) {
	name := req.GetName()
	if !slices.Contains(projectionNames, name) {
		return nil, fieldErr("name", "%q is not a projection: want state or history", name)
	}
	var from time.Time
	if ft := req.GetFromTime(); ft != nil {
		if err := ft.CheckValid(); err != nil {
			return nil, fieldErr("from_time", "%v", err)
		}
		if req.GetFromSeq() != 0 {
			return nil, fieldErr("from_time", "from_seq and from_time exclude each other: give one")
		}
		from = ft.AsTime()
	}
	r, err := ps.runner()
	if err != nil {
		return nil, err
	}
	st, err := r.Start(ctx, rebuild.Request{Projection: name, FromSeq: req.GetFromSeq(), FromTime: from})
	switch {
	case errors.Is(err, rebuild.ErrRunning):
		s := status.New(codes.FailedPrecondition, err.Error())
		if d, derr := s.WithDetails(&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: rebuildRunningType, Subject: "projections/" + name, Description: "a rebuild of " + name + " is running"},
		}}); derr == nil {
			s = d
		}
		return nil, s.Err()
	case errors.Is(err, rebuild.ErrNoReadingAfter):
		return nil, fieldErr("from_time", "%v", err)
	case err != nil:
		return nil, err
	}
	return &locksv1.RebuildProjectionResponse{Rebuild: rebuildProto(st)}, nil
}

var rebuildPhases = map[string]locksv1.RebuildPhase{
	"starting": locksv1.RebuildPhase_REBUILD_PHASE_STARTING,
	"catch-up": locksv1.RebuildPhase_REBUILD_PHASE_CATCH_UP,
	"swap":     locksv1.RebuildPhase_REBUILD_PHASE_SWAP,
	"done":     locksv1.RebuildPhase_REBUILD_PHASE_DONE,
	"failed":   locksv1.RebuildPhase_REBUILD_PHASE_FAILED,
}

func rebuildProto(st rebuild.Status) *locksv1.Rebuild {
	out := &locksv1.Rebuild{Projection: st.Projection, Phase: rebuildPhases[st.Phase], Running: st.Running,
		Done: st.Done, Total: st.Total, Rate: st.Rate, Eta: durationpb.New(st.ETA), FromSeq: st.FromSeq,
		StartTime: timestamppb.New(st.Started), Error: st.Err, OldTable: st.Result.OldTable}
	if !st.Finished.IsZero() {
		out.FinishTime = timestamppb.New(st.Finished)
	}
	return out
}

// restStatus is httpStatus, except that a rebuild already under way is 409 Conflict.
func restStatus(st *status.Status) int {
	if st.Code() == codes.FailedPrecondition {
		for _, d := range st.Details() {
			if pf, ok := d.(*errdetails.PreconditionFailure); ok && len(pf.GetViolations()) > 0 && (pf.GetViolations()[0].GetType() == rebuildRunningType || pf.GetViolations()[0].GetType() == deliveryStateType) {
				return http.StatusConflict
			}
		}
	}
	return httpStatus(st.Code())
}
