package api

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

func sensorReqs(prefix string, n int) []*locksv1.CreateSensorRequest {
	out := make([]*locksv1.CreateSensorRequest, n)
	for i := range out {
		id := fmt.Sprintf("%s%d", prefix, i)
		out[i] = &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: id, Address: "batch " + id}}
	}
	return out
}

// violations are the fields of the BadRequest detail of an INVALID_ARGUMENT.
func violations(t *testing.T, err error) []string {
	t.Helper()
	st := wantCode(t, err, codes.InvalidArgument)
	var out []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}

// resources are the names of the ResourceInfo details of err, which must have code c.
func resources(t *testing.T, err error, c codes.Code) []string {
	t.Helper()
	st := wantCode(t, err, c)
	var out []string
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.ResourceInfo); ok {
			out = append(out, ri.GetResourceName())
		}
	}
	return out
}

// BatchCreateSensors over gRPC: a full batch in one call, all or none, every bad item named.
func TestBatchCreateSensors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()

	// A sensor that reported before it was registered comes back with its state.
	e.setState("b7", 1, "online", 3)
	reqs := sensorReqs("b", maxBatch)
	reqs[5].Sensor.LostAfter = durationpb.New(90e9)
	out, err := e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.GetSensors()) != maxBatch || out.GetCreated() != maxBatch {
		t.Fatalf("%d sensors, %d created", len(out.GetSensors()), out.GetCreated())
	}
	for i, s := range out.GetSensors() {
		if s.GetId() != reqs[i].GetSensor().GetId() || s.GetAddress() != reqs[i].GetSensor().GetAddress() || s.GetEtag() == "" {
			t.Fatalf("sensors[%d] = %v, want %v", i, s, reqs[i].GetSensor())
		}
	}
	if out.GetSensors()[5].GetLostAfter().AsDuration().Seconds() != 90 || out.GetSensors()[7].GetState().GetRevision() != 3 {
		t.Fatalf("lost_after %v, state %v", out.GetSensors()[5].GetLostAfter(), out.GetSensors()[7].GetState())
	}
	if n := e.count(`SELECT count(*) FROM sensors`); n != maxBatch {
		t.Fatalf("%d sensors registered", n)
	}

	// Ids taken: 409 naming each, and nothing of the batch registered.
	again := append(sensorReqs("c", 3), reqs[2], reqs[900])
	_, err = e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: again})
	if got := resources(t, err, codes.AlreadyExists); strings.Join(got, ",") != "b2,b900" {
		t.Fatalf("existing named %v", got)
	}
	wantCode(t, err, codes.AlreadyExists, "2 of 5 sensors already exist", `requests[3].sensor.id "b2"`)
	if n := e.count(`SELECT count(*) FROM sensors WHERE id LIKE 'c%'`); n != 0 {
		t.Fatalf("a refused batch registered %d sensors", n)
	}
	// skip_existing: the new ones registered, the others left as they are.
	again[3] = &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "b2", Address: "changed"}}
	out, err = e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: again, SkipExisting: true})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetCreated() != 3 || out.GetSensors()[3].GetAddress() != "batch b2" || out.GetSensors()[0].GetId() != "c0" {
		t.Fatalf("skip_existing: created %d, %v", out.GetCreated(), out.GetSensors())
	}

	// Invalid items, a repeated id: every one named, nothing registered.
	bad := sensorReqs("d", 6)
	bad[1].Sensor.Id = "bad id"
	bad[2].Sensor.Address = ""
	bad[3] = &locksv1.CreateSensorRequest{}
	bad[4].Sensor.Id = "d0"
	bad[5].Sensor.LostAfter = durationpb.New(0)
	_, err = e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: bad})
	want := "requests[1].sensor.id,requests[2].sensor.address,requests[3].sensor,requests[4].sensor.id,requests[5].sensor.lost_after"
	if got := strings.Join(violations(t, err), ","); got != want {
		t.Fatalf("violations %s, want %s", got, want)
	}
	wantCode(t, err, codes.InvalidArgument, "5 invalid fields", `"d0" is also the id of requests[0]`)
	if n := e.count(`SELECT count(*) FROM sensors WHERE id LIKE 'd%'`); n != 0 {
		t.Fatalf("an invalid batch registered %d sensors", n)
	}

	// Size: none, and one more than allowed.
	_, err = e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{})
	if got := violations(t, err); len(got) != 1 || got[0] != "requests" {
		t.Fatalf("empty batch: %v", got)
	}
	_, err = e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: sensorReqs("e", maxBatch+1)})
	wantCode(t, err, codes.InvalidArgument, "1001 items; at most 1000")
}

// BatchCreateSubscriptions over gRPC: idempotent, all or none, every missing sensor named.
func TestBatchCreateSubscriptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withPrivateWebhooks())
	ctx := t.Context()
	if _, err := e.sensors.BatchCreateSensors(ctx, &locksv1.BatchCreateSensorsRequest{Requests: sensorReqs("s", maxBatch)}); err != nil {
		t.Fatal(err)
	}
	cr, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "Bulk", WebhookUrl: "http://127.0.0.1:9/hook"}})
	if err != nil {
		t.Fatal(err)
	}
	client := cr.GetClient().GetId()
	reqs := make([]*locksv1.CreateSubscriptionRequest, maxBatch)
	for i := range reqs {
		reqs[i] = &locksv1.CreateSubscriptionRequest{SensorId: fmt.Sprintf("s%d", i)}
	}
	reqs[1].EventTypes = []string{"sensor.connection_lost", "sensor.connection_restored"}
	reqs[2].ClientId = client
	out, err := e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: client, Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range out.GetSubscriptions() {
		if s.GetSensorId() != reqs[i].GetSensorId() || s.GetClientId() != client || s.GetEtag() == "" {
			t.Fatalf("subscriptions[%d] = %v", i, s)
		}
	}
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE client_id = $1`, client); n != maxBatch {
		t.Fatalf("%d subscriptions", n)
	}
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE sensor_id = 's1' AND event_types = '{sensor.connection_lost,sensor.connection_restored}'`); n != 1 {
		t.Fatal("s1's event types not stored")
	}
	// Again: the same subscriptions, with the event types of the new call.
	etag := out.GetSubscriptions()[0].GetEtag()
	reqs[1].EventTypes = nil
	out, err = e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: client, Requests: reqs[:10]})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetSubscriptions()[0].GetEtag() != etag || e.count(`SELECT count(*) FROM subscriptions WHERE sensor_id = 's1' AND event_types = '{}'`) != 1 {
		t.Fatalf("subscribing again: etag %s (was %s) or event types not replaced", out.GetSubscriptions()[0].GetEtag(), etag)
	}

	// Missing sensors: 404 naming each, nothing subscribed.
	other, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "Other", WebhookUrl: "http://127.0.0.1:9/hook"}})
	if err != nil {
		t.Fatal(err)
	}
	miss := []*locksv1.CreateSubscriptionRequest{{SensorId: "s3"}, {SensorId: "nosuch1"}, {SensorId: "s4"}, {SensorId: "nosuch2"}}
	_, err = e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: other.GetClient().GetId(), Requests: miss})
	if got := resources(t, err, codes.NotFound); strings.Join(got, ",") != "nosuch1,nosuch2" {
		t.Fatalf("missing named %v", got)
	}
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE client_id = $1`, other.GetClient().GetId()); n != 0 {
		t.Fatalf("a refused batch made %d subscriptions", n)
	}
	_, err = e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: "cl_nosuchclient0000000", Requests: miss[:1]})
	wantCode(t, err, codes.NotFound, "cl_nosuchclient0000000")

	// Invalid items: every one named.
	bad := []*locksv1.CreateSubscriptionRequest{{SensorId: "s1"}, {SensorId: "bad id"}, {SensorId: "s1"},
		{SensorId: "s2", ClientId: "cl_someoneelse"}, {SensorId: "s3", EventTypes: []string{"sensor.exploded"}}}
	_, err = e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: client, Requests: bad})
	want := "requests[1].sensor_id,requests[2].sensor_id,requests[3].client_id,requests[4].event_types"
	if got := strings.Join(violations(t, err), ","); got != want {
		t.Fatalf("violations %s, want %s", got, want)
	}
	_, err = e.subs.BatchCreateSubscriptions(ctx, &locksv1.BatchCreateSubscriptionsRequest{ClientId: client, Requests: append(reqs, reqs[0])})
	wantCode(t, err, codes.InvalidArgument, "at most 1000")
}

// The same calls over REST, as docs/contract.md shows them.
func TestBatchCreateREST(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withPrivateWebhooks())
	items := make([]map[string]any, 3)
	for i := range items {
		items[i] = map[string]any{"sensor": map[string]any{"id": fmt.Sprintf("r%d", i), "address": "rest"}}
	}
	r := e.want(e.do("POST", "/v1/sensors:batchCreate", map[string]any{"requests": items}), 200)
	if list, _ := r.body["sensors"].([]any); len(list) != 3 || r.body["created"] != float64(3) {
		t.Fatalf("batch create: %s", r.raw)
	}
	r = e.want(e.do("POST", "/v1/sensors:batchCreate", map[string]any{"requests": items}), 409, "3 of 3 sensors already exist")
	if len(r.body["details"].([]any)) != 3 {
		t.Fatalf("409 details: %s", r.raw)
	}
	items[1]["sensor"].(map[string]any)["id"] = "no good"
	r = e.want(e.do("POST", "/v1/sensors:batchCreate", map[string]any{"requests": items}), 400, "requests[1].sensor.id")
	if fieldOf(r) != "requests[1].sensor.id" {
		t.Fatalf("field %q", fieldOf(r))
	}
	big := make([]map[string]any, maxBatch+1)
	for i := range big {
		big[i] = map[string]any{"sensor": map[string]any{"id": fmt.Sprintf("x%d", i), "address": "x"}}
	}
	r = e.want(e.do("POST", "/v1/sensors:batchCreate", map[string]any{"requests": big}), 400, "at most 1000")
	if fieldOf(r) != "requests" {
		t.Fatalf("field %q", fieldOf(r))
	}

	// The largest batch fits the body limit: 1,000 sensors with addresses of 512 characters.
	for i := range big[:maxBatch] {
		big[i]["sensor"].(map[string]any)["address"] = strings.Repeat("a", maxAddressLen)
	}
	e.want(e.do("POST", "/v1/sensors:batchCreate", map[string]any{"requests": big[:maxBatch]}), 200)

	cl := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "rest", "webhook_url": "http://127.0.0.1:9/h"}), 200).str("id")
	subs := []map[string]any{{"sensor_id": "r0"}, {"sensor_id": "r2", "event_types": []string{"sensor.state_changed"}}}
	r = e.want(e.do("POST", "/v1/clients/"+cl+"/sensors:batchCreate", map[string]any{"requests": subs}), 200)
	if list, _ := r.body["subscriptions"].([]any); len(list) != 2 {
		t.Fatalf("batch subscribe: %s", r.raw)
	}
	r = e.want(e.do("GET", "/v1/clients/"+cl+"/sensors", nil), 200)
	if list, _ := r.body["sensors"].([]any); len(list) != 2 {
		t.Fatalf("the client's sensors: %s", r.raw)
	}
	subs = append(subs, map[string]any{"sensor_id": "r9"})
	e.want(e.do("POST", "/v1/clients/"+cl+"/sensors:batchCreate", map[string]any{"requests": subs}), 404, `requests[2].sensor_id "r9"`)
}
