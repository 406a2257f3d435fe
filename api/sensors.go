package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

type sensorService struct {
	locksv1.UnimplementedSensorServiceServer
	s *Server
}

// A sensor is always read with its state (LEFT JOIN: a registered sensor may have none yet).
const (
	sensorFrom = ` FROM sensors s LEFT JOIN sensor_state st ON st.sensor_id = s.id`
	// cteFrom is sensorFrom for a statement whose WITH s AS (… RETURNING *) made the row.
	cteFrom = ` FROM s LEFT JOIN sensor_state st ON st.sensor_id = s.id`
)

func (ss *sensorService) CreateSensor(ctx context.Context, req *locksv1.CreateSensorRequest) (*locksv1.CreateSensorResponse, error) {
	in := req.GetSensor()
	if in == nil {
		return nil, fieldErr("sensor", "required: {\"id\": …, \"address\": …}")
	}
	if err := checkSensorID("id", in.GetId()); err != nil {
		return nil, err
	}
	if err := checkText("address", in.GetAddress(), maxAddressLen); err != nil {
		return nil, err
	}
	lost, err := checkLostAfter(in.GetLostAfter())
	if err != nil {
		return nil, err
	}
	row, err := scanSensor(ss.s.db.QueryRow(ctx, `
		WITH s AS (
			INSERT INTO sensors (id, address, lost_after_ms) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING
			RETURNING *)
		SELECT `+sensorCols+`, `+stateCols+cteFrom, in.GetId(), in.GetAddress(), lost))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &ExistsError{Kind: "sensor", ID: in.GetId()}
	}
	if err != nil {
		return nil, fmt.Errorf("insert sensor: %w", err)
	}
	return &locksv1.CreateSensorResponse{Sensor: row.proto(ss.s.cfg.StateSeenInterval)}, nil
}

func (ss *sensorService) get(ctx context.Context, q DB, id string, lock bool) (sensorRow, error) {
	sql := `SELECT ` + sensorCols + `, ` + stateCols + sensorFrom + ` WHERE s.id = $1`
	if lock {
		sql += ` FOR UPDATE OF s`
	}
	row, err := scanSensor(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return row, &NotFoundError{Kind: "sensor", ID: id}
	}
	if err != nil {
		return row, fmt.Errorf("read sensor: %w", err)
	}
	return row, nil
}

func (ss *sensorService) GetSensor(ctx context.Context, req *locksv1.GetSensorRequest) (*locksv1.GetSensorResponse, error) {
	if err := checkSensorID("id", req.GetId()); err != nil {
		return nil, err
	}
	row, err := ss.get(ctx, ss.s.db, req.GetId(), false)
	if err != nil {
		return nil, err
	}
	return &locksv1.GetSensorResponse{Sensor: row.proto(ss.s.cfg.StateSeenInterval)}, nil
}

// sensorFilter is the state filter of ListSensors.
type sensorFilter struct {
	connection string // "online", "lost" or "" (any)
	data       *int16
}

func (f sensorFilter) scope() string {
	d := ""
	if f.data != nil {
		d = strconv.Itoa(int(*f.data))
	}
	return "connection=" + f.connection + "&data=" + d
}

// query is ListSensors' statement for a page after the id `after`. With a filter it walks
// sensor_state's (connection, sensor_id) or (data, sensor_id) index in id order, and only the
// conditions given are in the text (a generic "empty or equal" test cannot use an index): a page of
// the few lost sensors of a million reads about a page of rows instead of the whole fleet.
func (f sensorFilter) query(after string, limit int) (string, []any) {
	if f.connection == "" && f.data == nil {
		return `SELECT ` + sensorCols + `, ` + stateCols + sensorFrom + `
			WHERE s.id > $1 ORDER BY s.id LIMIT $2`, []any{after, limit}
	}
	args := []any{after, limit}
	where := ""
	if f.connection != "" {
		args = append(args, f.connection)
		where += fmt.Sprintf(" AND st.connection = $%d", len(args))
	}
	if f.data != nil {
		args = append(args, *f.data)
		where += fmt.Sprintf(" AND st.data = $%d", len(args))
	}
	return `SELECT ` + sensorCols + `, ` + stateCols + `
		FROM sensor_state st JOIN sensors s ON s.id = st.sensor_id
		WHERE st.sensor_id > $1` + where + `
		ORDER BY st.sensor_id LIMIT $2`, args
}

func (ss *sensorService) ListSensors(ctx context.Context, req *locksv1.ListSensorsRequest) (*locksv1.ListSensorsResponse, error) {
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	var f sensorFilter
	switch req.GetConnection() {
	case locksv1.Connection_CONNECTION_UNSPECIFIED:
	case locksv1.Connection_CONNECTION_ONLINE:
		f.connection = "online"
	case locksv1.Connection_CONNECTION_LOST:
		f.connection = "lost"
	default:
		return nil, fieldErr("connection", "must be CONNECTION_ONLINE or CONNECTION_LOST")
	}
	if req.Data != nil {
		if d := req.GetData(); d != 0 && d != 1 {
			return nil, fieldErr("data", "must be 0 or 1")
		}
		d := int16(req.GetData())
		f.data = &d
	}
	after, err := decodePageToken(req.GetPageToken(), listSensors, f.scope())
	if err != nil {
		return nil, err
	}
	sql, args := f.query(after, n+1)
	rows, err := ss.s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list sensors: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sensorRow, error) { return scanSensor(r) })
	if err != nil {
		return nil, fmt.Errorf("list sensors: %w", err)
	}
	page, next := nextPage(list, n, listSensors, f.scope(), func(r sensorRow) string { return r.ID })
	out := &locksv1.ListSensorsResponse{NextPageToken: next}
	for _, row := range page {
		out.Sensors = append(out.Sensors, row.proto(ss.s.cfg.StateSeenInterval))
	}
	return out, nil
}

var (
	sensorUpdatable  = []string{"address", "lost_after"}
	sensorOutputOnly = []string{"id", "state", "create_time", "update_time", "etag"}
)

func (ss *sensorService) UpdateSensor(ctx context.Context, req *locksv1.UpdateSensorRequest) (*locksv1.UpdateSensorResponse, error) {
	in := req.GetSensor()
	if in == nil {
		return nil, fieldErr("sensor", "required: the fields to change")
	}
	id := req.GetId()
	if id == "" {
		id = in.GetId()
	}
	if err := checkSensorID("id", id); err != nil {
		return nil, err
	}
	if in.GetId() != "" && in.GetId() != id {
		return nil, fieldErr("id", "the body's id %q is not the id %q of the sensor being updated; an id cannot be changed", in.GetId(), id)
	}
	paths, err := maskPaths(req.GetUpdateMask(), sensorUpdatable, sensorOutputOnly)
	if err != nil {
		return nil, err
	}
	var lost *int64
	for _, p := range paths {
		switch p {
		case "address":
			err = checkText("address", in.GetAddress(), maxAddressLen)
		case "lost_after":
			lost, err = checkLostAfter(in.GetLostAfter())
		}
		if err != nil {
			return nil, err
		}
	}
	var row sensorRow
	err = pgx.BeginFunc(ctx, ss.s.db, func(tx pgx.Tx) error {
		cur, err := ss.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := checkEtag(ctx, "sensor", id, cur.etag(), in.GetEtag()); err != nil {
			return err
		}
		if len(paths) == 0 {
			row = cur
			return nil
		}
		addr, lostMS := cur.Address, cur.LostAfterMS
		if slices.Contains(paths, "address") {
			addr = in.GetAddress()
		}
		if slices.Contains(paths, "lost_after") {
			lostMS = lost // unset: back to the server's default
		}
		row, err = scanSensor(tx.QueryRow(ctx, `
			WITH s AS (
				UPDATE sensors SET address = $2, lost_after_ms = $3, version = version + 1, updated_at = now()
				WHERE id = $1 RETURNING *)
			SELECT `+sensorCols+`, `+stateCols+cteFrom, id, addr, lostMS))
		if err != nil {
			return fmt.Errorf("update sensor: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &locksv1.UpdateSensorResponse{Sensor: row.proto(ss.s.cfg.StateSeenInterval)}, nil
}

func (ss *sensorService) DeleteSensor(ctx context.Context, req *locksv1.DeleteSensorRequest) (*locksv1.DeleteSensorResponse, error) {
	id := req.GetId()
	if err := checkSensorID("id", id); err != nil {
		return nil, err
	}
	err := pgx.BeginFunc(ctx, ss.s.db, func(tx pgx.Tx) error {
		cur, err := ss.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := checkEtag(ctx, "sensor", id, cur.etag(), req.GetEtag()); err != nil {
			return err
		}
		// Its subscriptions go with it (ON DELETE CASCADE). Its state and history are kept:
		// they come from the log, and registering the sensor again shows them at once.
		if _, err := tx.Exec(ctx, `DELETE FROM sensors WHERE id = $1`, id); err != nil {
			return fmt.Errorf("delete sensor: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &locksv1.DeleteSensorResponse{}, nil
}
