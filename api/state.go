package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

type stateService struct {
	locksv1.UnimplementedStateServiceServer
	s *Server
}

// GetSensorState reads the state projection, which knows every sensor ever heard from,
// registered or not.
func (st *stateService) GetSensorState(ctx context.Context, req *locksv1.GetSensorStateRequest) (*locksv1.GetSensorStateResponse, error) {
	id := req.GetSensorId()
	if err := checkSensorID("sensor_id", id); err != nil {
		return nil, err
	}
	row, err := scanState(st.s.db.QueryRow(ctx, `SELECT `+stateCols+` FROM sensor_state st WHERE st.sensor_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &NotFoundError{Kind: "state", ID: id}
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	return &locksv1.GetSensorStateResponse{State: row.proto(st.s.cfg.StateSeenInterval)}, nil
}
