package api

import (
	"context"
	"fmt"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// overviewService answers the dashboard's fleet-wide counts in one query instead of a page
// walk over every sensor.
type overviewService struct {
	locksv1.UnimplementedOverviewServiceServer
	s *Server
}

func (o *overviewService) GetSensorCounts(ctx context.Context, _ *locksv1.GetSensorCountsRequest) (*locksv1.GetSensorCountsResponse, error) {
	var r locksv1.GetSensorCountsResponse
	err := o.s.db.QueryRow(ctx, `SELECT count(*),
		  count(*) FILTER (WHERE st.connection = 'online'), count(*) FILTER (WHERE st.connection = 'lost'),
		  count(*) FILTER (WHERE st.data = 0), count(*) FILTER (WHERE st.data = 1),
		  count(*) FILTER (WHERE st.sensor_id IS NULL)`+sensorFrom).
		Scan(&r.Registered, &r.Online, &r.Lost, &r.Open, &r.Closed, &r.NeverHeard)
	if err != nil {
		return nil, fmt.Errorf("count sensors: %w", err)
	}
	return &r, nil
}
