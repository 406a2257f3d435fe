package api

import (
	"context"
	"fmt"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// historyService declares the history calls; they are served once the history projection
// (ClickHouse) is queried here. Until then they answer UNIMPLEMENTED (501) saying so.
type historyService struct {
	locksv1.UnimplementedHistoryServiceServer
	s *Server
}

func notYet(what string) error {
	return fmt.Errorf("%w: %s history is not served by this version of the API yet", ErrUnimplemented, what)
}

func (h *historyService) ListSensorReadings(ctx context.Context, req *locksv1.ListSensorReadingsRequest) (*locksv1.ListSensorReadingsResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	return nil, notYet("reading")
}

func (h *historyService) ListSensorEvents(ctx context.Context, req *locksv1.ListSensorEventsRequest) (*locksv1.ListSensorEventsResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	return nil, notYet("event")
}

func (h *historyService) ListClientDeliveries(ctx context.Context, req *locksv1.ListClientDeliveriesRequest) (*locksv1.ListClientDeliveriesResponse, error) {
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	return nil, notYet("delivery")
}
