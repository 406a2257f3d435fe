package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Bulk registration (AIP-233 batch create): a fleet of a million sensors is registered a
// thousand at a time, each batch one transaction and a few statements, instead of a call,
// a transaction and a round trip per sensor.

// maxBatch is the most items of one batch call.
const maxBatch = 1000

// checkBatchSize refuses an empty batch and one of more than maxBatch items.
func checkBatchSize(n int) error {
	switch {
	case n == 0:
		return fieldErr("requests", "required: 1 to %d items", maxBatch)
	case n > maxBatch:
		return fieldErr("requests", "%d items; at most %d are allowed in one call: split the batch", n, maxBatch)
	}
	return nil
}

// item names the field of batch item i.
func item(i int, field string) string { return fmt.Sprintf("requests[%d].%s", i, field) }

// notAmong is the BatchError (base ErrExists or ErrNotFound) naming each sensor of ids, the
// batch's, that is not among those the statement made or found.
func notAmong(base error, ids, among []string, field string) *BatchError {
	in := make(map[string]bool, len(among))
	for _, id := range among {
		in[id] = true
	}
	be := &BatchError{Err: base, Kind: "sensor", Of: len(ids)}
	for i, id := range ids {
		if !in[id] {
			be.Items = append(be.Items, BatchItem{Field: item(i, field), ID: id})
		}
	}
	return be
}

// checkNewSensor checks what CreateSensor takes, naming fields under prefix.
func checkNewSensor(prefix string, in *locksv1.Sensor) (lostAfterMS *int64, err error) {
	if in == nil {
		return nil, fieldErr(prefix+"sensor", "required: {\"id\": …, \"address\": …}")
	}
	if err := checkSensorID(prefix+"sensor.id", in.GetId()); err != nil {
		return nil, err
	}
	if err := checkText(prefix+"sensor.address", in.GetAddress(), maxAddressLen); err != nil {
		return nil, err
	}
	lost, err := checkLostAfter(in.GetLostAfter())
	return lost, withPrefix(prefix+"sensor.", err)
}

func (ss *sensorService) BatchCreateSensors(ctx context.Context, req *locksv1.BatchCreateSensorsRequest) (*locksv1.BatchCreateSensorsResponse, error) {
	reqs := req.GetRequests()
	if err := checkBatchSize(len(reqs)); err != nil {
		return nil, err
	}
	n := len(reqs)
	ids, addrs, losts := make([]string, n), make([]string, n), make([]*int64, n)
	first := make(map[string]int, n)
	var bad FieldErrors
	for i, r := range reqs {
		lost, err := checkNewSensor(item(i, ""), r.GetSensor())
		var fe *FieldError
		if errors.As(err, &fe) {
			bad = append(bad, fe)
			continue
		} else if err != nil {
			return nil, err
		}
		id := r.GetSensor().GetId()
		if j, dup := first[id]; dup {
			bad = append(bad, &FieldError{Field: item(i, "sensor.id"), Reason: fmt.Sprintf("%q is also the id of requests[%d]: every sensor once", id, j)})
			continue
		}
		first[id] = i
		ids[i], addrs[i], losts[i] = id, r.GetSensor().GetAddress(), lost
	}
	if len(bad) > 0 {
		return nil, bad
	}
	var out *locksv1.BatchCreateSensorsResponse
	err := pgx.BeginFunc(ctx, ss.s.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			INSERT INTO sensors (id, address, lost_after_ms)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
			ON CONFLICT (id) DO NOTHING
			RETURNING id`, ids, addrs, losts)
		if err != nil {
			return fmt.Errorf("insert sensors: %w", err)
		}
		created, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("insert sensors: %w", err)
		}
		if len(created) < n && !req.GetSkipExisting() {
			return notAmong(ErrExists, ids, created, "sensor.id") // rolls back what was inserted
		}
		// Read back with their state (a sensor that reported before it was registered has one).
		rows, err = tx.Query(ctx, `SELECT `+sensorCols+`, `+stateCols+sensorFrom+` WHERE s.id = ANY($1) FOR SHARE OF s`, ids)
		if err != nil {
			return fmt.Errorf("read sensors: %w", err)
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sensorRow, error) { return scanSensor(r) })
		if err != nil {
			return fmt.Errorf("read sensors: %w", err)
		}
		out = &locksv1.BatchCreateSensorsResponse{Sensors: make([]*locksv1.Sensor, n), Created: int32(len(created))}
		for _, row := range list {
			out.Sensors[first[row.ID]] = row.proto(ss.s.cfg.StateSeenInterval)
		}
		for i, s := range out.Sensors {
			if s == nil { // with skip_existing: deleted by another call at this very moment
				return &NotFoundError{Kind: "sensor", ID: ids[i]}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (sub *subscriptionService) BatchCreateSubscriptions(ctx context.Context, req *locksv1.BatchCreateSubscriptionsRequest) (*locksv1.BatchCreateSubscriptionsResponse, error) {
	clientID := req.GetClientId()
	if err := checkClientID("client_id", clientID); err != nil {
		return nil, err
	}
	reqs := req.GetRequests()
	if err := checkBatchSize(len(reqs)); err != nil {
		return nil, err
	}
	b, err := checkSubscriptionBatch(clientID, reqs)
	if err != nil {
		return nil, err
	}
	out := &locksv1.BatchCreateSubscriptionsResponse{Subscriptions: make([]*locksv1.Subscription, len(reqs))}
	err = pgx.BeginFunc(ctx, sub.s.db, func(tx pgx.Tx) error {
		if err := b.lockSubscribed(ctx, tx); err != nil {
			return err
		}
		return b.upsert(ctx, tx, out.Subscriptions)
	})
	if err != nil {
		return nil, err
	}
	sub.s.registryChanged(clientID)
	return out, nil
}

// subscriptionBatch is a checked BatchCreateSubscriptions call: item i subscribes clientID
// to ids[i] for types[i] (as stored); first maps a sensor id back to its item.
type subscriptionBatch struct {
	clientID string
	reqs     []*locksv1.CreateSubscriptionRequest
	ids      []string
	types    [][]string
	first    map[string]int
}

// checkSubscriptionBatch checks every item of a batch for clientID and names all the bad
// fields at once (FieldErrors).
func checkSubscriptionBatch(clientID string, reqs []*locksv1.CreateSubscriptionRequest) (*subscriptionBatch, error) {
	n := len(reqs)
	b := &subscriptionBatch{clientID: clientID, reqs: reqs, ids: make([]string, n), types: make([][]string, n), first: make(map[string]int, n)}
	var bad FieldErrors
	add := func(err error) bool {
		var fe *FieldError
		if errors.As(err, &fe) {
			bad = append(bad, fe)
			return true
		}
		return false
	}
	for i, r := range reqs {
		if c := r.GetClientId(); c != "" && c != clientID {
			bad = append(bad, &FieldError{Field: item(i, "client_id"), Reason: fmt.Sprintf("%q is not the client_id %q of the call: leave it empty", c, clientID)})
			continue
		}
		if add(checkSensorID(item(i, "sensor_id"), r.GetSensorId())) || add(checkEventTypes(item(i, "event_types"), r.GetEventTypes())) {
			continue
		}
		id := r.GetSensorId()
		if j, dup := b.first[id]; dup {
			bad = append(bad, &FieldError{Field: item(i, "sensor_id"), Reason: fmt.Sprintf("%q is also the sensor of requests[%d]: every sensor once", id, j)})
			continue
		}
		b.first[id] = i
		b.ids[i], b.types[i] = id, storedTypes(r.GetEventTypes())
	}
	if len(bad) > 0 {
		return nil, bad
	}
	return b, nil
}

// lockSubscribed locks the client and the sensors against deletion until the commit, so
// that a missing one is named rather than failing on a foreign key.
func (b *subscriptionBatch) lockSubscribed(ctx context.Context, tx pgx.Tx) error {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM clients WHERE id = $1 FOR SHARE)`, b.clientID).Scan(&ok); err != nil {
		return fmt.Errorf("read client: %w", err)
	}
	if !ok {
		return &NotFoundError{Kind: "client", ID: b.clientID}
	}
	rows, err := tx.Query(ctx, `SELECT id FROM sensors WHERE id = ANY($1) FOR SHARE`, b.ids)
	if err != nil {
		return fmt.Errorf("read sensors: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read sensors: %w", err)
	}
	if len(found) < len(b.ids) {
		return notAmong(ErrNotFound, b.ids, found, "sensor_id")
	}
	return nil
}

// upsert writes the batch's subscriptions (an existing one gets the new event types) and
// fills out, in the order of the items.
func (b *subscriptionBatch) upsert(ctx context.Context, tx pgx.Tx, out []*locksv1.Subscription) error {
	// event_types travel as one text per item, a Postgres array cannot be ragged: each
	// item's list is joined and split again (the known types have no comma: CheckTypes).
	joined := make([]string, len(b.types))
	for i, t := range b.types {
		joined[i] = strings.Join(t, ",")
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO subscriptions (client_id, sensor_id, event_types)
		SELECT $1, u.sensor_id, CASE WHEN u.types = '' THEN '{}'::text[] ELSE string_to_array(u.types, ',') END
		FROM unnest($2::text[], $3::text[]) AS u (sensor_id, types)
		ON CONFLICT (client_id, sensor_id) DO UPDATE SET event_types = excluded.event_types
		RETURNING sensor_id, created_at`, b.clientID, b.ids, joined)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	var sensorID string
	var created time.Time
	_, err = pgx.ForEachRow(rows, []any{&sensorID, &created}, func() error {
		i := b.first[sensorID]
		s := subscriptionProto(sensorID, b.clientID, created)
		s.EventTypes = b.reqs[i].GetEventTypes()
		out[i] = s
		return nil
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	return nil
}
