package api

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// fieldViolation is the field of the BadRequest detail of st, "" when there is none.
func fieldViolation(t testing.TB, err error) string {
	t.Helper()
	st := wantCode(t, err, codes.InvalidArgument)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// Every call over gRPC, with each error code of docs/contract.md section 3.
func TestGRPCLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()

	// Clients.
	cr, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "Ops", WebhookUrl: "https://203.0.113.20/hook"}})
	if err != nil {
		t.Fatal(err)
	}
	cl := cr.GetClient()
	if cl.GetId() == "" || cl.GetSigningSecret() == "" || cl.GetEtag() == "" || cl.GetCreateTime() == nil {
		t.Fatalf("created %v", cl)
	}
	_, err = e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "Ops", WebhookUrl: "https://user:pw@203.0.113.20/"}})
	if f := fieldViolation(t, err); f != "webhook_url" {
		t.Fatalf("field %q", f)
	}
	_, err = e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{})
	if f := fieldViolation(t, err); f != "client" {
		t.Fatalf("field %q", f)
	}
	g, err := e.clients.GetClient(ctx, &locksv1.GetClientRequest{Id: cl.GetId()})
	if err != nil || g.GetClient().GetSigningSecret() != cl.GetSigningSecret() {
		t.Fatalf("get: %v %v", g, err)
	}
	_, err = e.clients.GetClient(ctx, &locksv1.GetClientRequest{Id: "cl_none"})
	wantCode(t, err, codes.NotFound, "cl_none")
	l, err := e.clients.ListClients(ctx, &locksv1.ListClientsRequest{})
	if err != nil || len(l.GetClients()) != 1 || l.GetClients()[0].GetSigningSecret() != "" {
		t.Fatalf("list: %v %v", l, err)
	}
	u, err := e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl.GetId(),
		Client:     &locksv1.Client{Name: "Ops 2", Etag: cl.GetEtag()},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
	if err != nil || u.GetClient().GetName() != "Ops 2" || u.GetClient().GetWebhookUrl() != "https://203.0.113.20/hook" {
		t.Fatalf("update: %v %v", u, err)
	}
	_, err = e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl.GetId(),
		Client: &locksv1.Client{Name: "Ops 3", Etag: cl.GetEtag()}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
	wantCode(t, err, codes.FailedPrecondition, "etag")
	// If-Match as gRPC metadata.
	_, err = e.clients.UpdateClient(metadata.AppendToOutgoingContext(ctx, "if-match", cl.GetEtag()), &locksv1.UpdateClientRequest{Id: cl.GetId(),
		Client: &locksv1.Client{Name: "Ops 3"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
	wantCode(t, err, codes.FailedPrecondition)
	// An empty mask replaces every updatable field.
	_, err = e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl.GetId(), Client: &locksv1.Client{Name: "Only a name"}})
	if f := fieldViolation(t, err); f != "webhook_url" {
		t.Fatalf("field %q", f)
	}
	_, err = e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl.GetId(), Client: &locksv1.Client{Name: "x"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"colour"}}})
	if f := fieldViolation(t, err); f != "update_mask" {
		t.Fatalf("field %q", f)
	}
	_, err = e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: "cl_none", Client: &locksv1.Client{Name: "x"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"name"}}})
	wantCode(t, err, codes.NotFound)
	rot, err := e.clients.RotateClientSecret(ctx, &locksv1.RotateClientSecretRequest{Id: cl.GetId(), Etag: u.GetClient().GetEtag()})
	if err != nil || rot.GetClient().GetPreviousSecret() != cl.GetSigningSecret() || rot.GetClient().GetSigningSecret() == cl.GetSigningSecret() {
		t.Fatalf("rotate: %v %v", rot, err)
	}
	if d := time.Until(rot.GetClient().GetPreviousSecretUntil().AsTime()); d < 23*time.Hour || d > 25*time.Hour {
		t.Fatalf("previous secret signs for %s more, want about 24h", d)
	}
	_, err = e.clients.RotateClientSecret(ctx, &locksv1.RotateClientSecretRequest{Id: cl.GetId(), Etag: u.GetClient().GetEtag()})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = e.clients.RotateClientSecret(ctx, &locksv1.RotateClientSecretRequest{Id: "cl_none"})
	wantCode(t, err, codes.NotFound)

	// Sensors.
	s, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "0xA", Address: "Gate", LostAfter: durationpb.New(2 * time.Minute)}})
	if err != nil || s.GetSensor().GetLostAfter().AsDuration() != 2*time.Minute || s.GetSensor().GetState() != nil {
		t.Fatalf("create sensor: %v %v", s, err)
	}
	_, err = e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "0xA", Address: "Gate"}})
	wantCode(t, err, codes.AlreadyExists, "0xA")
	_, err = e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "TestSensor", Address: ""}})
	if f := fieldViolation(t, err); f != "address" {
		t.Fatalf("field %q", f)
	}
	if _, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "0123456789aBcDeF", Address: "Door"}}); err != nil {
		t.Fatal(err)
	}
	e.setState("0xA", 1, "online", 3)
	gs, err := e.sensors.GetSensor(ctx, &locksv1.GetSensorRequest{Id: "0xA"})
	if err != nil || gs.GetSensor().GetState().GetData() != 1 || gs.GetSensor().GetState().GetConnection() != locksv1.Connection_CONNECTION_ONLINE {
		t.Fatalf("get sensor: %v %v", gs, err)
	}
	_, err = e.sensors.GetSensor(ctx, &locksv1.GetSensorRequest{Id: "Missing"})
	wantCode(t, err, codes.NotFound)
	one := int32(1)
	ls, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{Data: &one, Connection: locksv1.Connection_CONNECTION_ONLINE})
	if err != nil || len(ls.GetSensors()) != 1 || ls.GetSensors()[0].GetId() != "0xA" {
		t.Fatalf("list sensors: %v %v", ls, err)
	}
	us, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "0xA", Sensor: &locksv1.Sensor{Address: "Main gate", Etag: s.GetSensor().GetEtag()},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"address"}}})
	if err != nil || us.GetSensor().GetAddress() != "Main gate" || us.GetSensor().GetLostAfter().AsDuration() != 2*time.Minute {
		t.Fatalf("update sensor: %v %v", us, err)
	}
	_, err = e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "0xA", Sensor: &locksv1.Sensor{Address: "x", Etag: s.GetSensor().GetEtag()},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"address"}}})
	wantCode(t, err, codes.FailedPrecondition)
	// The id may come in the resource alone.
	if _, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Sensor: &locksv1.Sensor{Id: "0xA", Address: "Gate"}}); err != nil {
		t.Fatal(err)
	}

	// State.
	st, err := e.state.GetSensorState(ctx, &locksv1.GetSensorStateRequest{SensorId: "0xA"})
	if err != nil || st.GetState().GetRevision() != 3 || st.GetState().GetLastSeenTime() == nil {
		t.Fatalf("state: %v %v", st, err)
	}
	_, err = e.state.GetSensorState(ctx, &locksv1.GetSensorStateRequest{SensorId: "0123456789aBcDeF"})
	wantCode(t, err, codes.NotFound)
	_, err = e.state.GetSensorState(ctx, &locksv1.GetSensorStateRequest{SensorId: ""})
	if f := fieldViolation(t, err); f != "sensor_id" {
		t.Fatalf("field %q", f)
	}

	// Subscriptions.
	sub, err := e.subs.CreateSubscription(ctx, &locksv1.CreateSubscriptionRequest{SensorId: "0xA", ClientId: cl.GetId()})
	if err != nil || sub.GetSubscription().GetEtag() == "" {
		t.Fatalf("subscribe: %v %v", sub, err)
	}
	_, err = e.subs.CreateSubscription(ctx, &locksv1.CreateSubscriptionRequest{SensorId: "Missing", ClientId: cl.GetId()})
	wantCode(t, err, codes.NotFound, "sensor")
	sc, err := e.subs.ListSensorClients(ctx, &locksv1.ListSensorClientsRequest{SensorId: "0xA"})
	if err != nil || len(sc.GetClients()) != 1 {
		t.Fatalf("sensor's clients: %v %v", sc, err)
	}
	cs, err := e.subs.ListClientSensors(ctx, &locksv1.ListClientSensorsRequest{ClientId: cl.GetId()})
	if err != nil || len(cs.GetSensors()) != 1 || cs.GetSensors()[0].GetState() == nil {
		t.Fatalf("client's sensors: %v %v", cs, err)
	}
	_, err = e.subs.DeleteSubscription(ctx, &locksv1.DeleteSubscriptionRequest{SensorId: "0xA", ClientId: cl.GetId(), Etag: "stale"})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := e.subs.DeleteSubscription(ctx, &locksv1.DeleteSubscriptionRequest{SensorId: "0xA", ClientId: cl.GetId(), Etag: sub.GetSubscription().GetEtag()}); err != nil {
		t.Fatal(err)
	}
	_, err = e.subs.DeleteSubscription(ctx, &locksv1.DeleteSubscriptionRequest{SensorId: "0xA", ClientId: cl.GetId()})
	wantCode(t, err, codes.NotFound)

	// History: declared, not served yet.
	_, err = e.history.ListSensorReadings(ctx, &locksv1.ListSensorReadingsRequest{SensorId: "0xA"})
	wantCode(t, err, codes.Unimplemented, "not served")
	_, err = e.history.ListSensorEvents(ctx, &locksv1.ListSensorEventsRequest{SensorId: "0xA"})
	wantCode(t, err, codes.Unimplemented)
	_, err = e.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: cl.GetId()})
	wantCode(t, err, codes.Unimplemented)

	// Deletes.
	_, err = e.sensors.DeleteSensor(ctx, &locksv1.DeleteSensorRequest{Id: "0xA", Etag: s.GetSensor().GetEtag()})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := e.sensors.DeleteSensor(ctx, &locksv1.DeleteSensorRequest{Id: "0xA"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.sensors.DeleteSensor(ctx, &locksv1.DeleteSensorRequest{Id: "0xA"})
	wantCode(t, err, codes.NotFound)
	if _, err := e.state.GetSensorState(ctx, &locksv1.GetSensorStateRequest{SensorId: "0xA"}); err != nil {
		t.Fatalf("state of a deleted sensor: %v", err)
	}
	_, err = e.clients.DeleteClient(ctx, &locksv1.DeleteClientRequest{Id: cl.GetId(), Etag: cl.GetEtag()})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := e.clients.DeleteClient(ctx, &locksv1.DeleteClientRequest{Id: cl.GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = e.clients.DeleteClient(ctx, &locksv1.DeleteClientRequest{Id: cl.GetId()})
	wantCode(t, err, codes.NotFound)
}

func TestGRPCAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	raw := locksv1.NewSensorServiceClient(e.raw)
	for _, c := range []struct {
		name string
		md   []string
		word string
	}{
		{"none", nil, "missing"},
		{"wrong", []string{"authorization", "Bearer wrong-token-0123456789"}, "not one of"},
		{"not bearer", []string{"authorization", testToken}, "Bearer"},
	} {
		ctx := t.Context()
		if c.md != nil {
			ctx = metadata.AppendToOutgoingContext(ctx, c.md...)
		}
		_, err := raw.ListSensors(ctx, &locksv1.ListSensorsRequest{})
		wantCode(t, err, codes.Unauthenticated, c.word)
		_, err = raw.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "S1", Address: "x"}})
		wantCode(t, err, codes.Unauthenticated)
	}
	if n := e.count(`SELECT count(*) FROM sensors`); n != 0 {
		t.Fatalf("an unauthenticated call created %d sensors", n)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testToken)
	if _, err := raw.ListSensors(ctx, &locksv1.ListSensorsRequest{}); err != nil {
		t.Fatal(err)
	}
	// Each call is counted by method and code.
	if n := e.metric("locks_api_requests_total", "Unauthenticated", "ListSensors"); n != 3 {
		t.Fatalf("locks_api_requests_total{ListSensors,Unauthenticated} = %v, want 3", n)
	}
	if n := e.metric("locks_api_requests_total", "OK", "ListSensors"); n != 1 {
		t.Fatalf("locks_api_requests_total{ListSensors,OK} = %v, want 1", n)
	}
	// Refused on their headers (tap), the unauthenticated calls are counted, not timed.
	if n := e.metric("locks_api_request_duration_seconds", "ListSensors"); n != 1 {
		t.Fatalf("locks_api_request_duration_seconds{ListSensors} counted %v calls, want 1", n)
	}
}

// The server stops when its context ends, within the grace it gives calls under way.
func TestServeStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// Serve twice is refused.
	ln := e.srv
	if err := ln.Serve(ctx, nopListener{}); err == nil {
		t.Fatal("second Serve did not fail")
	}
}

// Server reflection (for grpcurl) lists the services, to a caller with a token only.
func TestGRPCReflection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	list := func(ctx context.Context) ([]string, error) {
		stream, err := grpc_reflection_v1.NewServerReflectionClient(e.raw).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{
			MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{ListServices: "*"},
		}); err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the stream (e.g. refused it): the status comes with Recv.
				_, err = stream.Recv()
			}
			return nil, err
		}
		res, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range res.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names, nil
	}
	_, err := list(t.Context())
	wantCode(t, err, codes.Unauthenticated)
	names, err := list(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+testToken))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"locks.v1.ClientService", "locks.v1.SensorService", "locks.v1.SubscriptionService", "locks.v1.StateService", "locks.v1.HistoryService"} {
		if !slices.Contains(names, want) {
			t.Fatalf("reflection lists %v, without %s", names, want)
		}
	}
}

// Issue 25, item 4: an unauthenticated call is refused on its headers, before the server reads
// its message. A call that never sends its message gets UNAUTHENTICATED at once (a server
// that decoded first would wait for the message until the deadline), and one sending a
// 900 KiB message gets UNAUTHENTICATED, not a size or decoding error.
func TestGRPCRefusesBeforeDecoding(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: "CreateSensor"}
	st, err := e.raw.NewStream(ctx, desc, locksv1.SensorService_CreateSensor_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	// No message sent, the request half left open.
	err = st.RecvMsg(&locksv1.CreateSensorResponse{})
	wantCode(t, err, codes.Unauthenticated, "missing")
	if ctx.Err() != nil {
		t.Fatal("the refusal waited for the call's deadline")
	}

	big := &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "S1", Address: strings.Repeat("a", 900<<10)}}
	_, err = locksv1.NewSensorServiceClient(e.raw).CreateSensor(ctx, big)
	wantCode(t, err, codes.Unauthenticated)
	if n := e.count(`SELECT count(*) FROM sensors`); n != 0 {
		t.Fatalf("an unauthenticated call created %d sensors", n)
	}
}

// The gRPC port advertises its stream limit in its HTTP/2 settings.
func TestGRPCAdvertisesLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := net.Dial("tcp", e.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		got, ok := sf.Value(http2.SettingMaxConcurrentStreams)
		if !ok || got != MaxConcurrentStreams {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d (sent %v), want %d", got, ok, MaxConcurrentStreams)
		}
		if got, ok := sf.Value(http2.SettingMaxHeaderListSize); !ok || got != MaxHeaderListSize {
			t.Fatalf("SETTINGS_MAX_HEADER_LIST_SIZE = %d (sent %v), want %d", got, ok, MaxHeaderListSize)
		}
		return
	}
}
