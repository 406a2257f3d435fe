package api

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/event"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// d0 is when the test's dead deliveries died (updated_at).
var d0 = time.Date(2026, 11, 1, 1, 0, 0, 0, time.UTC)

// deliveryRow is a notifier_deliveries row as the notifier leaves it.
type deliveryRow struct {
	event, client, sensor string
	rev                   int64
	state                 string
	attempts              int
	updated               time.Time
}

// fillDeliveries creates a client over REST and writes notifier_deliveries rows for it (and
// for another client) the way the notifier does, returning the client's id. Dead: evt_a
// (S1, died at d0), evt_b (S2, d0+1h), evt_c (S3 revision 1, d0+2h, with a newer delivered
// revision 2 of S3); plus a pending row, and a dead row of another client.
func fillDeliveries(t *testing.T, e *env) string {
	t.Helper()
	r := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "Dead", "webhook_url": "https://203.0.113.10/hook"}), 200)
	id := r.str("id")
	for _, d := range []deliveryRow{
		{"evt_a", id, "S1", 1, "dead", 10, d0},
		{"evt_b", id, "S2", 1, "dead", 10, d0.Add(time.Hour)},
		{"evt_c", id, "S3", 1, "dead", 10, d0.Add(2 * time.Hour)},
		{"evt_c2", id, "S3", 2, "delivered", 1, d0.Add(3 * time.Hour)},
		{"evt_p", id, "S4", 1, "pending", 2, d0},
		{"evt_a", "cl_other0000000000000", "S1", 1, "dead", 10, d0},
	} {
		prev := uint8(0)
		payload, err := json.Marshal(event.Event{V: event.Version, ID: d.event, Type: event.TypeStateChanged,
			OccurredAt: d0.Add(-time.Hour), SensorID: d.sensor, Data: 1, PreviousData: &prev, Revision: d.rev})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(t.Context(), `INSERT INTO notifier_deliveries
			(event_id, client_id, sensor_id, revision, payload, state, attempts, last_status, last_error, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 503, 'HTTP 503', $8, $9)`,
			d.event, d.client, d.sensor, d.rev, payload, d.state, d.attempts, d0.Add(-time.Hour), d.updated); err != nil {
			t.Fatal(err)
		}
	}
	return id
}

func (e *env) deliveryState(client, eventID string) (state string, base int) {
	e.t.Helper()
	if err := e.db.QueryRow(e.t.Context(), `SELECT state, attempt_base FROM notifier_deliveries WHERE client_id = $1 AND event_id = $2`,
		client, eventID).Scan(&state, &base); err != nil {
		e.t.Fatal(err)
	}
	return state, base
}

func deadIDs(r resp) []string {
	var ids []string
	list, _ := r.body["dead_deliveries"].([]any)
	for _, x := range list {
		ids = append(ids, x.(map[string]any)["event_id"].(string))
	}
	return ids
}

func TestDeadDeliveriesREST(t *testing.T) {
	t.Parallel()
	e := newEnv(t) // no history database: the dead-letter list and redrive need only Postgres
	id := fillDeliveries(t, e)
	base := "/v1/clients/" + id + "/deliveries"

	// Paged by 2: evt_a and evt_b, then evt_c; neither the pending row nor the other client's.
	r := e.want(e.do("GET", base+"?state=dead&page_size=2", nil), 200)
	if ids := deadIDs(r); len(ids) != 2 || ids[0] != "evt_a" || ids[1] != "evt_b" || r.str("next_page_token") == "" {
		t.Fatalf("dead page 1: %s", r.raw)
	}
	first := r.body["dead_deliveries"].([]any)[0].(map[string]any)
	ev, _ := first["event"].(map[string]any)
	if first["sensor_id"] != "S1" || first["attempts"] != float64(10) || first["last_status_code"] != float64(503) ||
		first["last_error"] != "HTTP 503" || first["dead_time"] != "2026-11-01T01:00:00Z" || first["revision"] != "1" ||
		first["create_time"] != "2026-11-01T00:00:00Z" || ev["type"] != "EVENT_TYPE_STATE_CHANGED" || ev["id"] != "evt_a" ||
		ev["previous_data"] != float64(0) {
		t.Fatalf("dead delivery: %s", r.raw)
	}
	tok := r.str("next_page_token")
	r = e.want(e.do("GET", base+"?state=dead&page_size=2&page_token="+url.QueryEscape(tok), nil), 200)
	if ids := deadIDs(r); len(ids) != 1 || ids[0] != "evt_c" || r.str("next_page_token") != "" {
		t.Fatalf("dead page 2: %s", r.raw)
	}
	// A full last page has no next token.
	r = e.want(e.do("GET", base+"?state=dead&page_size=3", nil), 200)
	if ids := deadIDs(r); len(ids) != 3 || r.str("next_page_token") != "" {
		t.Fatalf("dead, one full page: %s", r.raw)
	}

	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		field              string
		noAuth             bool
	}{
		{"unknown state", "GET", base + "?state=zombie", nil, 400, "state", false},
		{"time range with dead", "GET", base + "?state=dead&start_time=2026-11-01T00:00:00Z", nil, 400, "start_time", false},
		{"token of another client", "GET", "/v1/clients/cl_other0000000000000/deliveries?state=dead&page_token=" + url.QueryEscape(tok), nil, 400, "page_token", false},
		{"bad page size", "GET", base + "?state=dead&page_size=-1", nil, 400, "page_size", false},
		{"dead of an unknown client", "GET", "/v1/clients/cl_other0000000000000/deliveries?state=dead", nil, 404, "", false},
		{"dead without a token", "GET", base + "?state=dead", nil, 401, "", true},
		{"redrive end before start", "POST", base + ":redrive", map[string]any{"start_time": "2026-11-01T03:00:00Z", "end_time": "2026-11-01T02:00:00Z"}, 400, "end_time", false},
		{"redrive bad time", "POST", base + ":redrive", map[string]any{"start_time": "yesterday"}, 400, "", false},
		{"redrive of an unknown client", "POST", "/v1/clients/cl_other0000000000000/deliveries:redrive", map[string]any{}, 404, "", false},
		{"redrive without a token", "POST", base + ":redrive", map[string]any{}, 401, "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.with(t)
			var hdr []string
			if c.noAuth {
				hdr = []string{"Authorization", ""}
			}
			r := e.want(e.do(c.method, c.path, c.body, hdr...), c.status)
			if c.field != "" && fieldOf(r) != c.field {
				t.Fatalf("field %q, want %q: %s", fieldOf(r), c.field, r.raw)
			}
		})
	}
	// Nothing was changed by the refused calls.
	if n := e.count(`SELECT count(*) FROM notifier_deliveries WHERE state = 'dead'`); n != 4 {
		t.Fatalf("%d dead rows after refused calls, want 4", n)
	}

	// A window redrives what died in it: evt_b only, pending again with a fresh schedule.
	r = e.want(e.do("POST", base+":redrive", map[string]any{"start_time": "2026-11-01T01:30:00Z", "end_time": "2026-11-01T02:30:00Z"}), 200)
	if r.body["redriven"] != float64(1) {
		t.Fatalf("redrive window: %s", r.raw)
	}
	if st, b := e.deliveryState(id, "evt_b"); st != "pending" || b != 10 {
		t.Fatalf("evt_b: %s attempt_base %d, want pending 10", st, b)
	}
	if st, _ := e.deliveryState(id, "evt_a"); st != "dead" {
		t.Fatalf("evt_a outside the window: %s", st)
	}
	// All the rest: evt_a is pending again; evt_c is superseded by its delivered revision 2
	// and not counted; the other client's dead row stays dead.
	r = e.want(e.do("POST", base+":redrive", map[string]any{}), 200)
	if r.body["redriven"] != float64(1) {
		t.Fatalf("redrive all: %s", r.raw)
	}
	for ev, want := range map[string]string{"evt_a": "pending", "evt_c": "superseded", "evt_c2": "delivered", "evt_p": "pending"} {
		if st, _ := e.deliveryState(id, ev); st != want {
			t.Fatalf("%s: %s, want %s", ev, st, want)
		}
	}
	if st, _ := e.deliveryState("cl_other0000000000000", "evt_a"); st != "dead" {
		t.Fatalf("other client's dead delivery: %s", st)
	}
	r = e.want(e.do("GET", base+"?state=dead", nil), 200)
	if ids := deadIDs(r); len(ids) != 0 || r.str("next_page_token") != "" {
		t.Fatalf("dead after redrive: %s", r.raw)
	}
	r = e.want(e.do("POST", base+":redrive", nil), 200)
	if r.body["redriven"] != float64(0) {
		t.Fatalf("second redrive: %s", r.raw)
	}
}

// The operator's view: `-` lists every client's dead deliveries, newest first, each with its
// client; a client token may not ask for it.
func TestDeadDeliveriesOfEveryClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := fillDeliveries(t, e)
	const other = "cl_other0000000000000"
	base := "/v1/clients/-/deliveries?state=dead"
	r := e.want(e.do("GET", base+"&page_size=3", nil), 200)
	list := r.body["dead_deliveries"].([]any)
	var got []string
	for _, x := range list {
		d := x.(map[string]any)
		got = append(got, d["client_id"].(string)+"/"+d["event_id"].(string))
	}
	want := []string{other + "/evt_a", id + "/evt_c", id + "/evt_b"}
	if strings.Join(got, " ") != strings.Join(want, " ") || r.str("next_page_token") == "" {
		t.Fatalf("every client's dead, page 1: %v, want %v (and a next page): %s", got, want, r.raw)
	}
	r = e.want(e.do("GET", base+"&page_size=3&page_token="+url.QueryEscape(r.str("next_page_token")), nil), 200)
	if ids := deadIDs(r); len(ids) != 1 || ids[0] != "evt_a" || r.str("next_page_token") != "" {
		t.Fatalf("every client's dead, page 2: %s", r.raw)
	}
	tr := e.want(e.do("POST", "/v1/clients/"+id+"/tokens", map[string]any{"name": "dead"}), 200)
	r = e.want(e.do("GET", base, nil, "Authorization", "Bearer "+tr.str("token")), 403)
	if strings.Contains(string(r.raw), "evt_") {
		t.Fatalf("a client token read other clients' dead deliveries: %s", r.raw)
	}
}

func TestDeadDeliveriesGRPC(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := fillDeliveries(t, e)
	ctx := t.Context()

	p1, err := e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: id, State: "dead", PageSize: 1})
	if err != nil || len(p1.GetDeadDeliveries()) != 1 || p1.GetDeadDeliveries()[0].GetEventId() != "evt_a" ||
		p1.GetDeadDeliveries()[0].GetDeadTime().AsTime() != d0 || p1.GetNextPageToken() == "" || len(p1.GetDeliveries()) != 0 {
		t.Fatalf("dead page 1: %v %v", p1, err)
	}
	p2, err := e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: id, State: "dead", PageSize: 5, PageToken: p1.GetNextPageToken()})
	if err != nil || len(p2.GetDeadDeliveries()) != 2 || p2.GetDeadDeliveries()[0].GetEventId() != "evt_b" || p2.GetNextPageToken() != "" {
		t.Fatalf("dead page 2: %v %v", p2, err)
	}
	// A token of the dead list does not fit the attempt history (nor the other way round).
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: id, State: "dead", PageToken: "garbage"})
	if f := fieldViolation(t, err); f != "page_token" {
		t.Fatalf("field %q", f)
	}
	// Without a history database the attempt history is still not served.
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: id})
	wantCode(t, err, codes.Unimplemented)
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: id, State: "DEAD"})
	if f := fieldViolation(t, err); f != "state" {
		t.Fatalf("field %q", f)
	}
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: "cl_nobody000000000000", State: "dead"})
	wantCode(t, err, codes.NotFound, "cl_nobody000000000000")

	_, err = e.history.RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: id,
		StartTime: timestamppb.New(d0.Add(time.Hour)), EndTime: timestamppb.New(d0.Add(time.Hour))})
	if f := fieldViolation(t, err); f != "end_time" {
		t.Fatalf("field %q", f)
	}
	_, err = e.history.RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: "cl_nobody000000000000"})
	wantCode(t, err, codes.NotFound)
	_, err = e.history.RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: ""})
	if f := fieldViolation(t, err); f != "client_id" {
		t.Fatalf("field %q", f)
	}
	_, err = locksv1.NewHistoryServiceClient(e.raw).RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: id})
	wantCode(t, err, codes.Unauthenticated)

	// Only an end: what died before d0+30m (evt_a).
	rd, err := e.history.RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: id, EndTime: timestamppb.New(d0.Add(30 * time.Minute))})
	if err != nil || rd.GetRedriven() != 1 {
		t.Fatalf("redrive: %v %v", rd, err)
	}
	if st, b := e.deliveryState(id, "evt_a"); st != "pending" || b != 10 {
		t.Fatalf("evt_a: %s %d", st, b)
	}
	if st, _ := e.deliveryState(id, "evt_b"); st != "dead" {
		t.Fatalf("evt_b: %s", st)
	}
}

// Without a dead-letter store the API says the dead-letter calls are not served here (501)
// instead of reaching into the notifier's tables.
func TestDeadDeliveriesWithoutStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(_ *Config, d *Deps) { d.DeadLetters = nil })
	id := fillDeliveries(t, e)
	base := "/v1/clients/" + id + "/deliveries"
	r := e.want(e.do("GET", base+"?state=dead", nil), 501)
	if !strings.Contains(r.str("message"), "dead-letter store") {
		t.Fatalf("list without a store: %s", r.raw)
	}
	e.want(e.do("POST", base+":redrive", map[string]any{}), 501)
	if st, _ := e.deliveryState(id, "evt_a"); st != "dead" {
		t.Fatalf("evt_a is %s after a refused redrive, want dead", st)
	}
}
