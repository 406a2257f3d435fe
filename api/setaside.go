package api

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/setaside"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// setAsideService lists the log messages the consumers refused (internal/setaside), read
// from the SET_ASIDE stream of Deps.JS; without one it answers UNIMPLEMENTED.
type setAsideService struct {
	locksv1.UnimplementedSetAsideServiceServer
	s *Server
}

func (ss *setAsideService) ListSetAside(ctx context.Context, req *locksv1.ListSetAsideRequest) (*locksv1.ListSetAsideResponse, error) {
	if ss.s.js == nil {
		return nil, fmt.Errorf("%w: this server has no NATS connection to read set-aside messages from", ErrUnimplemented)
	}
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	key, err := decodePageToken(req.GetPageToken(), listSetAside, "")
	if err != nil {
		return nil, err
	}
	var after uint64
	if key != "" {
		if after, err = strconv.ParseUint(key, 10, 64); err != nil {
			return nil, fieldErr("page_token", "not a page token of this list")
		}
	}
	recs, next, err := setaside.List(ctx, ss.s.js, after, n)
	if err != nil {
		return nil, err
	}
	out := &locksv1.ListSetAsideResponse{}
	for _, r := range recs {
		out.SetAside = append(out.SetAside, &locksv1.SetAsideMessage{Id: r.Seq, Consumer: r.Consumer, Stream: r.Stream,
			StreamSeq: r.StreamSeq, Subject: r.Subject, Reason: r.Reason, Detail: r.Detail,
			SetAsideTime: timestamppb.New(r.Time), Size: int64(r.Size), Payload: r.Payload})
	}
	if next > 0 {
		out.NextPageToken = encodePageToken(listSetAside, "", strconv.FormatUint(next, 10))
	}
	return out, nil
}
