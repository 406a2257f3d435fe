package api

import (
	"net/url"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// s0 is the start of the statistics example; it is in the past so that no span is cut at now.
var s0 = time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)

// fillStats writes, as the history projector would, the history of sensor ST:
// readings at +5m, +30m and +70m; events closed at +0 (revision 1), open at +45m (2),
// connection lost at +80m (3) and restored at +100m (4). By hand, in hours from s0:
// [0,1h): 2 readings, 2 state changes, closed 45m, open 15m; [1h,2h): 1 reading, open 20m +
// 20m, lost 20m.
func fillStats(t *testing.T, ch driver.Conn) {
	t.Helper()
	ctx := t.Context()
	b, err := ch.PrepareBatch(ctx, "INSERT INTO readings (sensor_id, seq, data, time, time_ms, received, received_ms, message_id)")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range []int{5, 30, 70} {
		at := s0.Add(time.Duration(m) * time.Minute)
		if err := b.Append("ST", uint64(i+1), uint8(1), at, uint16(0), at, uint16(0), "st"+at.Format("1504")); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	b, err = ch.PrepareBatch(ctx, "INSERT INTO events (event_id, sensor_id, type, revision, data, previous_data, time, time_ms, seq)")
	if err != nil {
		t.Fatal(err)
	}
	one := uint8(1)
	for _, e := range []struct {
		id, typ string
		rev     uint64
		data    uint8
		prev    *uint8
		min     int
	}{
		{"evt_s1", "state_changed", 1, 1, nil, 0},
		{"evt_s2", "state_changed", 2, 0, &one, 45},
		{"evt_s3", "connection_lost", 3, 0, nil, 80},
		{"evt_s4", "connection_restored", 4, 0, nil, 100},
	} {
		if err := b.Append(e.id, "ST", e.typ, e.rev, e.data, e.prev, s0.Add(time.Duration(e.min)*time.Minute), uint16(0), e.rev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func TestSensorStatsREST(t *testing.T) {
	t.Parallel()
	var ch driver.Conn
	e := newEnv(t, withHistory(t, &ch))
	fillStats(t, ch)
	q := url.Values{"start_time": {"2026-11-01T10:00:00Z"}, "end_time": {"2026-11-01T12:00:00Z"}, "interval": {"1h"}}
	r := e.want(e.do("GET", "/v1/sensors/ST/stats?"+q.Encode(), nil), 200)
	list, _ := r.body["intervals"].([]any)
	if len(list) != 2 {
		t.Fatalf("intervals: %s", r.raw)
	}
	want := []map[string]any{
		{"start_time": "2026-11-01T10:00:00Z", "end_time": "2026-11-01T11:00:00Z", "readings": "2", "state_changes": "2",
			"closed_duration": "2700s", "open_duration": "900s", "lost_duration": "0s"},
		{"start_time": "2026-11-01T11:00:00Z", "end_time": "2026-11-01T12:00:00Z", "readings": "1", "state_changes": "0",
			"closed_duration": "0s", "open_duration": "2400s", "lost_duration": "1200s"},
	}
	for i, w := range want {
		got := list[i].(map[string]any)
		for k, v := range w {
			if got[k] != v {
				t.Fatalf("interval %d: %s = %v, want %v: %s", i, k, got[k], v, r.raw)
			}
		}
	}
	// The default interval is 1h; a sensor without history has empty intervals, not a 404.
	r = e.want(e.do("GET", "/v1/sensors/Nobody/stats?start_time=2026-11-01T10:00:00Z&end_time=2026-11-01T12:00:00Z", nil), 200)
	if list, _ := r.body["intervals"].([]any); len(list) != 2 || list[1].(map[string]any)["readings"] != "0" {
		t.Fatalf("unknown sensor: %s", r.raw)
	}

	for _, c := range []struct {
		name, query string
		status      int
		field       string
		noAuth      bool
	}{
		{"interval not a duration", "start_time=2026-11-01T10:00:00Z&interval=hourly", 400, "interval", false},
		{"interval below 1s", "start_time=2026-11-01T10:00:00Z&interval=500ms", 400, "interval", false},
		{"negative interval", "start_time=2026-11-01T10:00:00Z&interval=-1h", 400, "interval", false},
		{"too many intervals", "start_time=2026-11-01T10:00:00Z&end_time=2026-11-02T10:00:00Z&interval=1s", 400, "interval", false},
		{"no start", "end_time=2026-11-01T12:00:00Z", 400, "start_time", false},
		{"end before start", "start_time=2026-11-01T12:00:00Z&end_time=2026-11-01T10:00:00Z", 400, "end_time", false},
		{"no token", "start_time=2026-11-01T10:00:00Z", 401, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.with(t)
			var hdr []string
			if c.noAuth {
				hdr = []string{"Authorization", ""}
			}
			r := e.want(e.do("GET", "/v1/sensors/ST/stats?"+c.query, nil, hdr...), c.status)
			if c.field != "" && fieldOf(r) != c.field {
				t.Fatalf("field %q, want %q: %s", fieldOf(r), c.field, r.raw)
			}
		})
	}
	e.want(e.do("GET", "/v1/sensors/bad-id/stats?start_time=2026-11-01T10:00:00Z", nil), 400, "sensor_id")
}

func TestSensorStatsGRPC(t *testing.T) {
	t.Parallel()
	var ch driver.Conn
	e := newEnv(t, withHistory(t, &ch))
	fillStats(t, ch)
	ctx := t.Context()
	// Half-hour intervals over the first 90 minutes: closed 30m; closed 15m + open 15m;
	// open 20m + lost 10m.
	st, err := e.history.GetSensorStats(ctx, &locksv1.GetSensorStatsRequest{SensorId: "ST",
		StartTime: timestamppb.New(s0), EndTime: timestamppb.New(s0.Add(90 * time.Minute)), Interval: "30m"})
	if err != nil || len(st.GetIntervals()) != 3 {
		t.Fatalf("stats: %v %v", st, err)
	}
	for i, w := range []struct {
		readings, changes  int64
		closed, open, lost time.Duration
	}{
		{1, 1, 30 * time.Minute, 0, 0},
		{1, 1, 15 * time.Minute, 15 * time.Minute, 0},
		{1, 0, 0, 20 * time.Minute, 10 * time.Minute},
	} {
		iv := st.GetIntervals()[i]
		if iv.GetReadings() != w.readings || iv.GetStateChanges() != w.changes || iv.GetClosedDuration().AsDuration() != w.closed ||
			iv.GetOpenDuration().AsDuration() != w.open || iv.GetLostDuration().AsDuration() != w.lost ||
			iv.GetStartTime().AsTime() != s0.Add(time.Duration(i)*30*time.Minute) {
			t.Fatalf("interval %d: %v", i, iv)
		}
	}
	_, err = e.history.GetSensorStats(ctx, &locksv1.GetSensorStatsRequest{SensorId: "ST", StartTime: timestamppb.New(s0), Interval: "1x"})
	if f := fieldViolation(t, err); f != "interval" {
		t.Fatalf("field %q", f)
	}
	_, err = e.history.GetSensorStats(ctx, &locksv1.GetSensorStatsRequest{SensorId: "ST", StartTime: &timestamppb.Timestamp{Seconds: -1e13}})
	if f := fieldViolation(t, err); f != "start_time" {
		t.Fatalf("field %q", f)
	}
	_, err = locksv1.NewHistoryServiceClient(e.raw).GetSensorStats(ctx, &locksv1.GetSensorStatsRequest{SensorId: "ST", StartTime: timestamppb.New(s0)})
	wantCode(t, err, codes.Unauthenticated)
}

// Without a history database statistics are not served.
func TestSensorStatsNotServed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.history.GetSensorStats(t.Context(), &locksv1.GetSensorStatsRequest{SensorId: "ST", StartTime: timestamppb.New(s0)})
	wantCode(t, err, codes.Unimplemented, "not served")
}
