package api

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

var h0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// fillHistory writes, as the history projector would: 10 readings of S1 a minute apart
// (data alternating, 123 ms past the minute), 3 events of S1 and 2 attempts for client C1.
func fillHistory(t *testing.T, ch driver.Conn) {
	t.Helper()
	ctx := t.Context()
	b, err := ch.PrepareBatch(ctx, "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		at := h0.Add(time.Duration(i) * time.Minute)
		if err := b.Append("S1", uint64(i+1), uint8(i%2), at, uint16(123), at.Add(time.Second), uint16(456), fmt.Sprint("m", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Append("Other", uint64(99), uint8(1), h0, uint16(0), h0, uint16(0), "o"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	b, err = ch.PrepareBatch(ctx, "INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)")
	if err != nil {
		t.Fatal(err)
	}
	zero := uint8(0)
	for _, e := range []struct {
		id, typ string
		rev     uint64
		data    uint8
		prev    *uint8
		at      time.Time
	}{
		{"evt_1", "state_changed", 1, 0, nil, h0},
		{"evt_2", "state_changed", 2, 1, &zero, h0.Add(time.Minute)},
		{"evt_3", "connection_lost", 3, 1, nil, h0.Add(2 * time.Hour)},
	} {
		if err := b.Append(e.id, "S1", e.typ, e.rev, e.data, e.prev, e.at, uint16(0), e.rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	b, err = ch.PrepareBatch(ctx, "INSERT INTO deliveries (event_id, client_id, sensor_id, attempt, time, time_ms, status_code, latency_ms, error, outcome)")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append("evt_2", "cl_C1", "S1", uint16(1), h0.Add(time.Minute), uint16(5), uint16(503), uint32(250), "HTTP 503", "retry"); err != nil {
		t.Fatal(err)
	}
	if err := b.Append("evt_2", "cl_C1", "S1", uint16(2), h0.Add(2*time.Minute), uint16(5), uint16(200), uint32(40), "", "delivered"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func TestHistoryREST(t *testing.T) {
	t.Parallel()
	var ch driver.Conn
	e := newEnv(t, withHistory(t, &ch))
	fillHistory(t, ch)

	// Readings, oldest first, paged; start inclusive, end exclusive on the reading's time.
	var times []string
	token := ""
	for {
		q := url.Values{"page_size": {"4"}}
		if token != "" {
			q.Set("page_token", token)
		}
		r := e.want(e.do("GET", "/v1/sensors/S1/readings?"+q.Encode(), nil), 200)
		list, _ := r.body["readings"].([]any)
		for _, x := range list {
			m := x.(map[string]any)
			times = append(times, m["time"].(string))
			if m["data"] != float64((len(times)-1)%2) || m["received_time"] == "" {
				t.Fatalf("reading %d: %v", len(times), m)
			}
		}
		if token = r.str("next_page_token"); token == "" {
			break
		}
	}
	if len(times) != 10 || times[0] != "2026-11-22T10:00:00.123Z" || times[9] != "2026-11-22T10:09:00.123Z" {
		t.Fatalf("readings: %v", times)
	}
	r := e.want(e.do("GET", "/v1/sensors/S1/readings?start_time=2026-11-22T10:02:00.123Z&end_time=2026-11-22T10:05:00.123Z", nil), 200)
	if list, _ := r.body["readings"].([]any); len(list) != 3 || list[0].(map[string]any)["time"] != "2026-11-22T10:02:00.123Z" {
		t.Fatalf("readings in a range: %s", r.raw)
	}
	// A sensor never heard of (or deleted) has an empty history, not a 404.
	r = e.want(e.do("GET", "/v1/sensors/Nobody/readings", nil), 200)
	if list, _ := r.body["readings"].([]any); len(list) != 0 || r.str("next_page_token") != "" {
		t.Fatalf("unknown sensor: %s", r.raw)
	}
	e.want(e.do("GET", "/v1/sensors/S1/readings?start_time=2026-11-22T11:00:00Z&end_time=2026-11-22T10:00:00Z", nil), 400, "end_time")
	e.want(e.do("GET", "/v1/sensors/S1/readings?page_token=garbage", nil), 400, "page_token")
	e.want(e.do("GET", "/v1/sensors/S1/readings?page_size=-1", nil), 400, "page_size")
	e.want(e.do("GET", "/v1/sensors/bad-id/readings", nil), 400, "sensor_id")
	e.want(e.do("GET", "/v1/sensors/S1/readings", nil, "Authorization", ""), 401)

	// Events with their types by name and previous_data only when there is one.
	r = e.want(e.do("GET", "/v1/sensors/S1/events", nil), 200)
	list, _ := r.body["events"].([]any)
	if len(list) != 3 {
		t.Fatalf("events: %s", r.raw)
	}
	first, second, third := list[0].(map[string]any), list[1].(map[string]any), list[2].(map[string]any)
	if first["type"] != "EVENT_TYPE_STATE_CHANGED" || first["previous_data"] != nil || first["id"] != "evt_1" ||
		second["previous_data"] != float64(0) || second["data"] != float64(1) || second["revision"] != "2" ||
		third["type"] != "EVENT_TYPE_CONNECTION_LOST" || third["time"] != "2026-11-22T12:00:00Z" {
		t.Fatalf("events: %s", r.raw)
	}
	r = e.want(e.do("GET", "/v1/sensors/S1/events?end_time=2026-11-22T10:01:00Z", nil), 200)
	if list, _ := r.body["events"].([]any); len(list) != 1 {
		t.Fatalf("events before 10:01: %s", r.raw)
	}

	// Deliveries: every attempt with its status, latency and outcome.
	r = e.want(e.do("GET", "/v1/clients/cl_C1/deliveries", nil), 200)
	list, _ = r.body["deliveries"].([]any)
	if len(list) != 2 {
		t.Fatalf("deliveries: %s", r.raw)
	}
	a1, a2 := list[0].(map[string]any), list[1].(map[string]any)
	if a1["event_id"] != "evt_2" || a1["attempt"] != float64(1) || a1["status_code"] != float64(503) || a1["latency"] != "0.250s" ||
		a1["outcome"] != "DELIVERY_OUTCOME_RETRY" || a1["error"] != "HTTP 503" || a1["time"] != "2026-11-22T10:01:00.005Z" ||
		a2["outcome"] != "DELIVERY_OUTCOME_DELIVERED" || a2["status_code"] != float64(200) {
		t.Fatalf("deliveries: %s", r.raw)
	}
}

func TestHistoryGRPC(t *testing.T) {
	t.Parallel()
	var ch driver.Conn
	e := newEnv(t, withHistory(t, &ch))
	fillHistory(t, ch)
	ctx := t.Context()
	rs, err := e.history.ListSensorReadings(ctx, &locksv1.ListSensorReadingsRequest{SensorId: "S1", StartTime: timestamppb.New(h0.Add(9 * time.Minute)), PageSize: 5000})
	if err != nil || len(rs.GetReadings()) != 1 || rs.GetReadings()[0].GetReceivedTime().AsTime() != h0.Add(9*time.Minute+time.Second+456*time.Millisecond) {
		t.Fatalf("readings: %v %v", rs, err)
	}
	p1, err := e.history.ListSensorEvents(ctx, &locksv1.ListSensorEventsRequest{SensorId: "S1", PageSize: 2})
	if err != nil || len(p1.GetEvents()) != 2 || p1.GetNextPageToken() == "" {
		t.Fatalf("events: %v %v", p1, err)
	}
	p2, err := e.history.ListSensorEvents(ctx, &locksv1.ListSensorEventsRequest{SensorId: "S1", PageSize: 2, PageToken: p1.GetNextPageToken()})
	if err != nil || len(p2.GetEvents()) != 1 || p2.GetEvents()[0].GetType() != locksv1.EventType_EVENT_TYPE_CONNECTION_LOST || p2.GetNextPageToken() != "" {
		t.Fatalf("events page 2: %v %v", p2, err)
	}
	// A token of one sensor does not fit another.
	_, err = e.history.ListSensorEvents(ctx, &locksv1.ListSensorEventsRequest{SensorId: "Other", PageToken: p1.GetNextPageToken()})
	if f := fieldViolation(t, err); f != "page_token" {
		t.Fatalf("field %q", f)
	}
	ds, err := e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: "cl_C1", EndTime: timestamppb.New(h0.Add(2 * time.Minute))})
	if err != nil || len(ds.GetDeliveries()) != 1 || ds.GetDeliveries()[0].GetLatency().AsDuration() != 250*time.Millisecond {
		t.Fatalf("deliveries: %v %v", ds, err)
	}
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: "cl_C1", StartTime: &timestamppb.Timestamp{Seconds: -1e13}})
	if f := fieldViolation(t, err); f != "start_time" {
		t.Fatalf("field %q", f)
	}
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: ""})
	wantCode(t, err, codes.InvalidArgument, "client_id")
}
