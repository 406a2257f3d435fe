package api

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// stateDead is the state filter of ListClientDeliveries that lists dead-lettered deliveries.
const stateDead = "dead"

// DeadLetters is the notifier's dead-letter store, as the API sees it: the deliveries whose
// every attempt failed, and sending them again. It needs no history database. Unlike the
// history lists these calls answer NOT_FOUND for an unknown client: they act on what the
// client has now, not on what is kept of it.
type DeadLetters interface {
	// ListDead lists a client's dead deliveries in id order after afterID (0: from the
	// start), at most limit (1 to 1000).
	ListDead(ctx context.Context, clientID string, afterID int64, limit int) ([]event.DeadDelivery, error)
	// ListAllDead lists every client's dead deliveries, newest first (by id) before
	// beforeID (0: from the newest), at most limit (1 to 1000).
	ListAllDead(ctx context.Context, beforeID int64, limit int) ([]event.DeadDelivery, error)
	// Redrive sends again a client's deliveries that died in [from, to) (a zero time leaves
	// that end open), each with a fresh schedule; it returns how many will be sent.
	Redrive(ctx context.Context, clientID string, from, to time.Time) (int64, error)
}

func deadLettersNotServed() error {
	return fmt.Errorf("%w: dead-lettered deliveries are not served by this process: it was started without the notifier's dead-letter store", ErrUnimplemented)
}

// everyClient is the client id that lists the dead deliveries of every client (an
// administrator's call: a client token's own client is never it).
const everyClient = "-"

// listDead pages through a client's dead deliveries by their row id (the token's key), or
// every client's, newest first, for everyClient.
func (h *historyService) listDead(ctx context.Context, req *locksv1.ListClientDeliveriesRequest) (*locksv1.ListClientDeliveriesResponse, error) {
	if req.GetStartTime() != nil {
		return nil, fieldErr("start_time", "not supported with state=%s", stateDead)
	}
	if req.GetEndTime() != nil {
		return nil, fieldErr("end_time", "not supported with state=%s", stateDead)
	}
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	key, err := decodePageToken(req.GetPageToken(), listDeadDeliveries, req.GetClientId())
	if err != nil {
		return nil, err
	}
	var after int64
	if key != "" {
		if after, err = strconv.ParseInt(key, 10, 64); err != nil || after < 0 {
			return nil, fieldErr("page_token", "not a page token of this list")
		}
	}
	if h.s.deadLetters == nil {
		return nil, deadLettersNotServed()
	}
	all := req.GetClientId() == everyClient
	list := func(after int64, n int) ([]event.DeadDelivery, error) {
		if all {
			return h.s.deadLetters.ListAllDead(ctx, after, n)
		}
		return h.s.deadLetters.ListDead(ctx, req.GetClientId(), after, n)
	}
	if !all {
		if err := h.s.exists(ctx, "client", req.GetClientId()); err != nil {
			return nil, err
		}
	}
	dead, err := list(after, n)
	if err != nil {
		return nil, err
	}
	out := &locksv1.ListClientDeliveriesResponse{Deliveries: []*locksv1.Delivery{}, DeadDeliveries: make([]*locksv1.DeadDelivery, 0, len(dead))}
	for _, d := range dead {
		dd := &locksv1.DeadDelivery{
			ClientId: d.ClientID, EventId: d.EventID, SensorId: d.SensorID, Revision: d.Revision, Attempts: int32(d.Attempts),
			LastStatusCode: int32(d.LastStatus), LastError: d.LastError, CreateTime: ts(d.CreatedAt), DeadTime: ts(d.DeadAt),
		}
		if e := d.Event; e.ID != "" {
			dd.Event = sensorEventProto(e.ID, e.Type, e.OccurredAt, e.Data, e.PreviousData, e.Revision)
		}
		out.DeadDeliveries = append(out.DeadDeliveries, dd)
	}
	// ListDead takes at most 1000, the largest page, so one more row cannot be asked for
	// with the page: a full page looks one row further to know whether another follows.
	if len(dead) == n {
		last := dead[n-1].ID
		more, err := list(last, 1)
		if err != nil {
			return nil, err
		}
		if len(more) > 0 {
			out.NextPageToken = encodePageToken(listDeadDeliveries, req.GetClientId(), strconv.FormatInt(last, 10))
		}
	}
	return out, nil
}

func (h *historyService) RedriveClientDeliveries(ctx context.Context, req *locksv1.RedriveClientDeliveriesRequest) (*locksv1.RedriveClientDeliveriesResponse, error) {
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	from, to, err := timeRange(req.GetStartTime(), req.GetEndTime())
	if err != nil {
		return nil, err
	}
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return nil, fieldErr("end_time", "must be after start_time (%s), got %s",
			from.UTC().Format(time.RFC3339Nano), to.UTC().Format(time.RFC3339Nano))
	}
	if h.s.deadLetters == nil {
		return nil, deadLettersNotServed()
	}
	if err := h.s.exists(ctx, "client", req.GetClientId()); err != nil {
		return nil, err
	}
	n, err := h.s.deadLetters.Redrive(ctx, req.GetClientId(), from, to)
	if err != nil {
		return nil, err
	}
	h.s.log.Info("dead deliveries redriven", "client_id", req.GetClientId(), "redriven", n,
		"start_time", from, "end_time", to)
	// An operator redriving says the endpoint is fixed: every notifier closes its breaker.
	if h.s.controls != nil {
		if err := h.s.controls.Reset(ctx, req.GetClientId()); err != nil {
			h.s.log.Warn("redrive: breaker reset not sent; the deliveries wait for the cooldown", "client_id", req.GetClientId(), "err", err)
		}
	}
	return &locksv1.RedriveClientDeliveriesResponse{Redriven: int32(min(n, math.MaxInt32))}, nil
}
