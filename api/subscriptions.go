package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

type subscriptionService struct {
	locksv1.UnimplementedSubscriptionServiceServer
	s *Server
}

func subscriptionName(sensorID, clientID string) string {
	return fmt.Sprintf("of client %q to sensor %q", clientID, sensorID)
}

func subscriptionProto(sensorID, clientID string, created time.Time) *locksv1.Subscription {
	return &locksv1.Subscription{
		SensorId: sensorID, ClientId: clientID, CreateTime: ts(created),
		Etag: etagOf(sensorID+"/"+clientID, created, 1),
	}
}

func (sub *subscriptionService) CreateSubscription(ctx context.Context, req *locksv1.CreateSubscriptionRequest) (*locksv1.CreateSubscriptionResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	if err := checkEventTypes("event_types", req.GetEventTypes()); err != nil {
		return nil, err
	}
	// One statement: whether each side exists, the new row if one was made, else the old one
	// (a data-modifying CTE's row is not visible to the other subqueries, the old one is).
	var sensorOK, clientOK bool
	var created, existing *time.Time
	err := sub.s.db.QueryRow(ctx, `
		WITH s AS (SELECT id FROM sensors WHERE id = $1),
		     c AS (SELECT id FROM clients WHERE id = $2),
		     ins AS (
				INSERT INTO subscriptions (client_id, sensor_id, event_types) SELECT c.id, s.id, $3 FROM s, c
				ON CONFLICT (client_id, sensor_id) DO UPDATE SET event_types = excluded.event_types
				RETURNING created_at)
		SELECT EXISTS (SELECT 1 FROM s), EXISTS (SELECT 1 FROM c), (SELECT created_at FROM ins),
			(SELECT created_at FROM subscriptions WHERE client_id = $2 AND sensor_id = $1)`,
		req.GetSensorId(), req.GetClientId(), storedTypes(req.GetEventTypes())).Scan(&sensorOK, &clientOK, &created, &existing)
	if isForeignKeyViolation(err) {
		// The sensor or client was deleted at this very moment.
		return nil, fmt.Errorf("%w: sensor %q or client %q was just deleted", ErrNotFound, req.GetSensorId(), req.GetClientId())
	}
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	switch {
	case !sensorOK:
		return nil, &NotFoundError{Kind: "sensor", ID: req.GetSensorId()}
	case !clientOK:
		return nil, &NotFoundError{Kind: "client", ID: req.GetClientId()}
	case created == nil && existing == nil:
		// Subscribed at this very moment by another call, whose row this statement's
		// snapshot does not show: read it now.
		var t time.Time
		if err := sub.s.db.QueryRow(ctx, `SELECT created_at FROM subscriptions WHERE client_id = $1 AND sensor_id = $2`,
			req.GetClientId(), req.GetSensorId()).Scan(&t); err != nil {
			return nil, fmt.Errorf("subscribe: read the concurrent subscription: %w", err)
		}
		existing = &t
	}
	if created == nil {
		created = existing
	}
	out := subscriptionProto(req.GetSensorId(), req.GetClientId(), *created)
	out.EventTypes = req.GetEventTypes()
	sub.s.registryChanged(req.GetClientId())
	return &locksv1.CreateSubscriptionResponse{Subscription: out}, nil
}

func (sub *subscriptionService) DeleteSubscription(ctx context.Context, req *locksv1.DeleteSubscriptionRequest) (*locksv1.DeleteSubscriptionResponse, error) {
	if err := checkSensorID("sensor_id", req.GetSensorId()); err != nil {
		return nil, err
	}
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	err := pgx.BeginFunc(ctx, sub.s.db, func(tx pgx.Tx) error {
		var created time.Time
		err := tx.QueryRow(ctx, `SELECT created_at FROM subscriptions WHERE client_id = $1 AND sensor_id = $2 FOR UPDATE`,
			req.GetClientId(), req.GetSensorId()).Scan(&created)
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{Kind: "subscription", ID: subscriptionName(req.GetSensorId(), req.GetClientId())}
		}
		if err != nil {
			return fmt.Errorf("read subscription: %w", err)
		}
		cur := subscriptionProto(req.GetSensorId(), req.GetClientId(), created).GetEtag()
		if err := checkEtag(ctx, "subscription", req.GetSensorId()+"/"+req.GetClientId(), cur, req.GetEtag()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM subscriptions WHERE client_id = $1 AND sensor_id = $2`, req.GetClientId(), req.GetSensorId()); err != nil {
			return fmt.Errorf("unsubscribe: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sub.s.registryChanged(req.GetClientId())
	return &locksv1.DeleteSubscriptionResponse{}, nil
}

// exists fails with a NotFoundError unless the row of kind ("sensor" or "client") exists.
// The subscription lists ask it only when a page is empty: a subscription row implies both
// its sensor and its client (foreign keys, ON DELETE CASCADE).
func (s *Server) exists(ctx context.Context, kind, id string) error {
	table := map[string]string{"sensor": "sensors", "client": "clients"}[kind]
	var ok bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE id = $1)`, id).Scan(&ok); err != nil {
		return fmt.Errorf("read %s: %w", kind, err)
	}
	if !ok {
		return &NotFoundError{Kind: kind, ID: id}
	}
	return nil
}

func (sub *subscriptionService) ListSensorClients(ctx context.Context, req *locksv1.ListSensorClientsRequest) (*locksv1.ListSensorClientsResponse, error) {
	sensorID := req.GetSensorId()
	if err := checkSensorID("sensor_id", sensorID); err != nil {
		return nil, err
	}
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, err := decodePageToken(req.GetPageToken(), listSensorClients, sensorID)
	if err != nil {
		return nil, err
	}
	rows, err := sub.s.db.Query(ctx, `SELECT `+clientCols+`
		FROM subscriptions sub JOIN clients c ON c.id = sub.client_id
		WHERE sub.sensor_id = $1 AND sub.client_id > $2
		ORDER BY sub.client_id LIMIT $3`, sensorID, after, n+1)
	if err != nil {
		return nil, fmt.Errorf("list a sensor's clients: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (clientRow, error) { return scanClient(r) })
	if err != nil {
		return nil, fmt.Errorf("list a sensor's clients: %w", err)
	}
	if len(list) == 0 {
		if err := sub.s.exists(ctx, "sensor", sensorID); err != nil {
			return nil, err
		}
	}
	page, next := nextPage(list, n, listSensorClients, sensorID, func(r clientRow) string { return r.ID })
	out := &locksv1.ListSensorClientsResponse{NextPageToken: next}
	now := time.Now()
	for _, row := range page {
		out.Clients = append(out.Clients, row.proto(false, now))
	}
	return out, nil
}

func (sub *subscriptionService) ListClientSensors(ctx context.Context, req *locksv1.ListClientSensorsRequest) (*locksv1.ListClientSensorsResponse, error) {
	clientID := req.GetClientId()
	if err := checkClientID("client_id", clientID); err != nil {
		return nil, err
	}
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, err := decodePageToken(req.GetPageToken(), listClientSensors, clientID)
	if err != nil {
		return nil, err
	}
	rows, err := sub.s.db.Query(ctx, `SELECT `+sensorCols+`, `+stateCols+`
		FROM subscriptions sub JOIN sensors s ON s.id = sub.sensor_id
		LEFT JOIN sensor_state st ON st.sensor_id = s.id
		WHERE sub.client_id = $1 AND sub.sensor_id > $2
		ORDER BY sub.sensor_id LIMIT $3`, clientID, after, n+1)
	if err != nil {
		return nil, fmt.Errorf("list a client's sensors: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sensorRow, error) { return scanSensor(r) })
	if err != nil {
		return nil, fmt.Errorf("list a client's sensors: %w", err)
	}
	if len(list) == 0 {
		if err := sub.s.exists(ctx, "client", clientID); err != nil {
			return nil, err
		}
	}
	page, next := nextPage(list, n, listClientSensors, clientID, func(r sensorRow) string { return r.ID })
	out := &locksv1.ListClientSensorsResponse{NextPageToken: next}
	for _, row := range page {
		out.Sensors = append(out.Sensors, row.proto(sub.s.cfg.StateSeenInterval))
	}
	return out, nil
}
