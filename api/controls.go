package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/webhookctl"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Controls are the notifier's webhook controls, as the API sees them (*notifier.Controls is
// one). Enable, Resend and Reset tell every notifier process to close the client's circuit
// breaker; Resend fails with webhookctl's errors.
type Controls interface {
	Enable(ctx context.Context, client string) (bool, error)
	Disable(ctx context.Context, client, reason string) (bool, error)
	Resend(ctx context.Context, client, eventID string) error
	SendTest(ctx context.Context, client string) (string, error)
	Stats(ctx context.Context, client string) (webhookctl.Stats, error)
	Reset(ctx context.Context, client string) error
	Changed(client string) error
}

// registryChanged tells the notifiers that client's entry (URL, secret, filters,
// subscriptions) changed or is gone, so that what they claimed ahead is read afresh; best
// effort (what they hold is at most a couple of seconds old).
func (s *Server) registryChanged(client string) {
	if s.controls == nil {
		return
	}
	if err := s.controls.Changed(client); err != nil {
		s.log.Warn("cannot tell the notifiers that a client changed", "client", client, "err", err)
	}
}

// deliveryStateType marks the FAILED_PRECONDITION of a delivery that cannot be resent (or a
// test event the client's filter refuses), which REST answers with 409 Conflict.
const deliveryStateType = "DELIVERY_STATE"

// maxReasonLen bounds an operator's reason for disabling a client.
const maxReasonLen = 500

func controlsNotServed() error {
	return fmt.Errorf("%w: webhook controls are not served by this process: it was started without the notifier's controls", ErrUnimplemented)
}

// conflict is a FAILED_PRECONDITION that REST answers with 409 (restStatus).
func conflict(subject string, err error) error {
	s := status.New(codes.FailedPrecondition, err.Error())
	if d, derr := s.WithDetails(&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
		{Type: deliveryStateType, Subject: subject, Description: err.Error()},
	}}); derr == nil {
		s = d
	}
	return s.Err()
}

// checkEventTypes refuses a filter naming anything but the webhook types.
func checkEventTypes(field string, types []string) error {
	if err := webhookctl.CheckTypes(types); err != nil {
		return fieldErr(field, "%v", err)
	}
	return nil
}

// storedTypes is a filter as stored: never NULL.
func storedTypes(types []string) []string {
	if types == nil {
		return []string{}
	}
	return types
}

type controlService struct {
	locksv1.UnimplementedWebhookControlServiceServer
	s *Server
}

// client checks id and that the controls are served and the client exists.
func (c *controlService) client(ctx context.Context, field, id string) error {
	if err := checkClientID(field, id); err != nil {
		return err
	}
	if c.s.controls == nil {
		return controlsNotServed()
	}
	return c.s.exists(ctx, "client", id)
}

func (c *controlService) read(ctx context.Context, id string) (*locksv1.Client, error) {
	row, err := (&clientService{s: c.s}).get(ctx, c.s.db, id, false)
	if err != nil {
		return nil, err
	}
	return row.proto(true, time.Now()), nil
}

func (c *controlService) EnableClient(ctx context.Context, req *locksv1.EnableClientRequest) (*locksv1.EnableClientResponse, error) {
	if err := c.client(ctx, "id", req.GetId()); err != nil {
		return nil, err
	}
	was, err := c.s.controls.Enable(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	c.s.log.Info("webhook endpoint enabled", "client_id", req.GetId(), "was_disabled", was)
	cl, err := c.read(ctx, req.GetId())
	return &locksv1.EnableClientResponse{Client: cl}, err
}

func (c *controlService) DisableClient(ctx context.Context, req *locksv1.DisableClientRequest) (*locksv1.DisableClientResponse, error) {
	if err := c.client(ctx, "id", req.GetId()); err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "disabled by an operator"
	}
	if err := checkText("reason", reason, maxReasonLen); err != nil {
		return nil, err
	}
	was, err := c.s.controls.Disable(ctx, req.GetId(), reason)
	if err != nil {
		return nil, err
	}
	c.s.log.Info("webhook endpoint disabled by an operator", "client_id", req.GetId(), "was_enabled", was, "reason", reason)
	cl, err := c.read(ctx, req.GetId())
	return &locksv1.DisableClientResponse{Client: cl}, err
}

func (c *controlService) ResendDelivery(ctx context.Context, req *locksv1.ResendDeliveryRequest) (*locksv1.ResendDeliveryResponse, error) {
	if req.GetEventId() == "" {
		return nil, fieldErr("event_id", "required")
	}
	if err := c.client(ctx, "client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	err := c.s.controls.Resend(ctx, req.GetClientId(), req.GetEventId())
	switch {
	case errors.Is(err, webhookctl.ErrNoDelivery):
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, webhookctl.ErrSuperseded), errors.Is(err, webhookctl.ErrNotFinished):
		return nil, conflict("clients/"+req.GetClientId()+"/deliveries/"+req.GetEventId(), err)
	case err != nil:
		return nil, err
	}
	c.s.log.Info("delivery resent", "client_id", req.GetClientId(), "event_id", req.GetEventId())
	return &locksv1.ResendDeliveryResponse{}, nil
}

func (c *controlService) SendTestEvent(ctx context.Context, req *locksv1.SendTestEventRequest) (*locksv1.SendTestEventResponse, error) {
	if err := c.client(ctx, "id", req.GetId()); err != nil {
		return nil, err
	}
	cl, err := c.read(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if ts := cl.GetEventTypes(); len(ts) > 0 && !slices.Contains(ts, webhookctl.TypeTest) {
		return nil, conflict("clients/"+req.GetId(), fmt.Errorf("the client's event_types %v leave out %s", ts, webhookctl.TypeTest))
	}
	id, err := c.s.controls.SendTest(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &locksv1.SendTestEventResponse{EventId: id}, nil
}

func (c *controlService) GetClientStats(ctx context.Context, req *locksv1.GetClientStatsRequest) (*locksv1.GetClientStatsResponse, error) {
	if err := c.client(ctx, "id", req.GetId()); err != nil {
		return nil, err
	}
	st, err := c.s.controls.Stats(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	out := &locksv1.ClientStats{ClientId: req.GetId(), Delivered: st.Delivered, FailedAttempts: st.FailedAttempts,
		Retried: st.Retried, Dead: st.Dead, Pending: st.Pending,
		LatencyP50Ms: ms(st.LatencyP50), LatencyP90Ms: ms(st.LatencyP90), LatencyP99Ms: ms(st.LatencyP99),
		DisabledReason: st.DisabledReason}
	if !st.LastSuccess.IsZero() {
		out.LastSuccessTime = timestamppb.New(st.LastSuccess)
	}
	if !st.DisabledAt.IsZero() {
		out.DisabledTime = timestamppb.New(st.DisabledAt)
	}
	return &locksv1.GetClientStatsResponse{Stats: out}, nil
}
