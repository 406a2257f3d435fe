package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/history"
	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// History is what the history calls need of the history projection (ClickHouse);
// *history.Store is one.
type History interface {
	Readings(ctx context.Context, sensorID string, q history.Query) (history.ReadingsPage, error)
	Events(ctx context.Context, sensorID string, q history.Query) (history.EventsPage, error)
	Deliveries(ctx context.Context, clientID string, q history.Query) (history.DeliveriesPage, error)
	Stats(ctx context.Context, sensorID string, q history.StatsQuery) ([]history.Interval, error)
}

// historyService serves the history calls from the history projection; without one
// (Deps.History nil) they answer UNIMPLEMENTED (501) saying so. A sensor's history is kept
// when it is deleted, and readings of sensors never registered are recorded too, so these
// lists never answer NOT_FOUND: an unknown id simply has no history.
type historyService struct {
	locksv1.UnimplementedHistoryServiceServer
	s *Server
}

func notServed(what string) error {
	return fmt.Errorf("%w: %s history is not served by this process: it was started without the history database (ClickHouse)", ErrUnimplemented, what)
}

// historyQuery checks the paging and time range the way the other lists do (a page_size
// above 1000 is lowered to it) and builds the history query.
func historyQuery(start, end *timestamppb.Timestamp, size int32, token string) (history.Query, error) {
	var q history.Query
	n, err := pageSize(size)
	if err != nil {
		return q, err
	}
	q.PageSize, q.PageToken = n, token
	q.Start, q.End, err = timeRange(start, end)
	return q, err
}

// historyErr turns the history store's invalid-input errors into this API's.
func historyErr(err error) error {
	var ie *history.InvalidError
	if errors.As(err, &ie) {
		return &FieldError{Field: ie.Field, Reason: ie.Reason}
	}
	return err
}

func (h *historyService) ListSensorReadings(ctx context.Context, req *locksv1.ListSensorReadingsRequest) (*locksv1.ListSensorReadingsResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	if h.s.history == nil {
		return nil, notServed("reading")
	}
	q, err := historyQuery(req.GetStartTime(), req.GetEndTime(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	page, err := h.s.history.Readings(ctx, req.GetSensorId(), q)
	if err != nil {
		return nil, historyErr(err)
	}
	out := &locksv1.ListSensorReadingsResponse{NextPageToken: page.NextPageToken, Readings: make([]*locksv1.Reading, 0, len(page.Readings))}
	for _, r := range page.Readings {
		out.Readings = append(out.Readings, &locksv1.Reading{Data: int32(r.Data), Time: ts(r.Time), ReceivedTime: ts(r.ReceivedTime)})
	}
	return out, nil
}

var eventTypes = map[string]locksv1.EventType{
	event.TypeStateChanged:       locksv1.EventType_EVENT_TYPE_STATE_CHANGED,
	event.TypeConnectionLost:     locksv1.EventType_EVENT_TYPE_CONNECTION_LOST,
	event.TypeConnectionRestored: locksv1.EventType_EVENT_TYPE_CONNECTION_RESTORED,
}

// sensorEventProto renders an event, as the history store or a dead delivery's payload
// holds it.
func sensorEventProto(id, typ string, at time.Time, data uint8, prev *uint8, revision int64) *locksv1.SensorEvent {
	ev := &locksv1.SensorEvent{Id: id, Type: eventTypes[typ], Time: ts(at), Data: int32(data), Revision: revision}
	if prev != nil {
		p := int32(*prev)
		ev.PreviousData = &p
	}
	return ev
}

func (h *historyService) ListSensorEvents(ctx context.Context, req *locksv1.ListSensorEventsRequest) (*locksv1.ListSensorEventsResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	if h.s.history == nil {
		return nil, notServed("event")
	}
	q, err := historyQuery(req.GetStartTime(), req.GetEndTime(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	page, err := h.s.history.Events(ctx, req.GetSensorId(), q)
	if err != nil {
		return nil, historyErr(err)
	}
	out := &locksv1.ListSensorEventsResponse{NextPageToken: page.NextPageToken, Events: make([]*locksv1.SensorEvent, 0, len(page.Events))}
	for _, e := range page.Events {
		out.Events = append(out.Events, sensorEventProto(e.ID, e.Type, e.Time, e.Data, e.PreviousData, e.Revision))
	}
	return out, nil
}

var outcomes = map[string]locksv1.DeliveryOutcome{
	event.OutcomeDelivered:  locksv1.DeliveryOutcome_DELIVERY_OUTCOME_DELIVERED,
	event.OutcomeRetry:      locksv1.DeliveryOutcome_DELIVERY_OUTCOME_RETRY,
	event.OutcomeDead:       locksv1.DeliveryOutcome_DELIVERY_OUTCOME_DEAD,
	event.OutcomeCancelled:  locksv1.DeliveryOutcome_DELIVERY_OUTCOME_CANCELLED,
	event.OutcomeSuperseded: locksv1.DeliveryOutcome_DELIVERY_OUTCOME_SUPERSEDED,
}

func (h *historyService) ListClientDeliveries(ctx context.Context, req *locksv1.ListClientDeliveriesRequest) (*locksv1.ListClientDeliveriesResponse, error) {
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	switch req.GetState() {
	case "":
	case stateDead:
		return h.listDead(ctx, req)
	default:
		return nil, fieldErr("state", "must be empty (every attempt) or %q (dead-lettered deliveries), got %q", stateDead, req.GetState())
	}
	if h.s.history == nil {
		return nil, notServed("delivery")
	}
	q, err := historyQuery(req.GetStartTime(), req.GetEndTime(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	page, err := h.s.history.Deliveries(ctx, req.GetClientId(), q)
	if err != nil {
		return nil, historyErr(err)
	}
	out := &locksv1.ListClientDeliveriesResponse{NextPageToken: page.NextPageToken, Deliveries: make([]*locksv1.Delivery, 0, len(page.Deliveries))}
	for _, d := range page.Deliveries {
		out.Deliveries = append(out.Deliveries, &locksv1.Delivery{
			EventId: d.EventID, SensorId: d.SensorID, Attempt: int32(d.Attempt), Time: ts(d.Time),
			StatusCode: int32(d.StatusCode), Latency: durationpb.New(d.Latency), Outcome: outcomes[d.Outcome], Error: d.Error,
		})
	}
	return out, nil
}

func (h *historyService) GetSensorStats(ctx context.Context, req *locksv1.GetSensorStatsRequest) (*locksv1.GetSensorStatsResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	var q history.StatsQuery
	if iv := req.GetInterval(); iv != "" {
		d, err := time.ParseDuration(iv)
		if err != nil {
			return nil, fieldErr("interval", "not a duration such as 1h, 15m or 90s: %q", iv)
		}
		if d <= 0 {
			return nil, fieldErr("interval", "must be positive, got %s", iv)
		}
		q.Interval = d
	}
	if req.GetStartTime() == nil {
		return nil, fieldErr("start_time", "required")
	}
	var err error
	if q.Start, q.End, err = timeRange(req.GetStartTime(), req.GetEndTime()); err != nil {
		return nil, err
	}
	if !q.End.IsZero() && !q.End.After(q.Start) {
		return nil, fieldErr("end_time", "must be after start_time")
	}
	if h.s.history == nil {
		return nil, notServed("statistics")
	}
	ivs, err := h.s.history.Stats(ctx, req.GetSensorId(), q)
	if err != nil {
		return nil, historyErr(err)
	}
	out := &locksv1.GetSensorStatsResponse{Intervals: make([]*locksv1.SensorStatsInterval, 0, len(ivs))}
	for _, iv := range ivs {
		out.Intervals = append(out.Intervals, &locksv1.SensorStatsInterval{
			StartTime: ts(iv.Start), EndTime: ts(iv.End), Readings: iv.Readings, StateChanges: iv.StateChanges,
			ClosedDuration: durationpb.New(iv.Closed), OpenDuration: durationpb.New(iv.Open), LostDuration: durationpb.New(iv.Lost),
		})
	}
	return out, nil
}
