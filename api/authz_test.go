package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	own := principal{clientID: "cl_a", tokenID: "tok_a"}
	mask := func(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }
	for _, tc := range []struct {
		name   string
		p      principal
		method string
		req    any
		deny   bool
		sensor string
	}{
		{"admin anything", principal{admin: true}, "/locks.v1.SensorService/DeleteSensor", &locksv1.DeleteSensorRequest{Id: "s"}, false, ""},
		{"admin unknown method", principal{admin: true}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil, false, ""},
		{"own client", own, "/locks.v1.ClientService/GetClient", &locksv1.GetClientRequest{Id: "cl_a"}, false, ""},
		{"other client", own, "/locks.v1.ClientService/GetClient", &locksv1.GetClientRequest{Id: "cl_b"}, true, ""},
		{"empty client", own, "/locks.v1.ClientService/GetClient", &locksv1.GetClientRequest{}, true, ""},
		{"own feed", own, "/locks.v1.ClientEventService/ListClientEvents", &locksv1.ListClientEventsRequest{ClientId: "cl_a"}, false, ""},
		{"other feed", own, "/locks.v1.ClientEventService/ListClientEvents", &locksv1.ListClientEventsRequest{ClientId: "cl_b"}, true, ""},
		{"own tokens", own, "/locks.v1.ClientTokenService/ListClientTokens", &locksv1.ListClientTokensRequest{ClientId: "cl_a"}, true, ""},
		{"delete own client", own, "/locks.v1.ClientService/DeleteClient", &locksv1.DeleteClientRequest{Id: "cl_a"}, true, ""},
		{"disable own client", own, "/locks.v1.WebhookControlService/DisableClient", &locksv1.DisableClientRequest{Id: "cl_a"}, true, ""},
		{"subscribe", own, "/locks.v1.SubscriptionService/CreateSubscription", &locksv1.CreateSubscriptionRequest{ClientId: "cl_a", SensorId: "s"}, true, ""},
		{"sensor state", own, "/locks.v1.StateService/GetSensorState", &locksv1.GetSensorStateRequest{SensorId: "s1"}, false, "s1"},
		{"sensor record", own, "/locks.v1.SensorService/GetSensor", &locksv1.GetSensorRequest{Id: "s1"}, true, ""},
		{"reflection", own, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil, true, ""},
		{"update url", own, "/locks.v1.ClientService/UpdateClient",
			&locksv1.UpdateClientRequest{Id: "cl_a", Client: &locksv1.Client{WebhookUrl: "https://x"}, UpdateMask: mask("webhook_url", "event_types")}, false, ""},
		{"update id in body", own, "/locks.v1.ClientService/UpdateClient",
			&locksv1.UpdateClientRequest{Client: &locksv1.Client{Id: "cl_a"}, UpdateMask: mask("webhook_url")}, false, ""},
		{"update other's url", own, "/locks.v1.ClientService/UpdateClient",
			&locksv1.UpdateClientRequest{Id: "cl_b", Client: &locksv1.Client{WebhookUrl: "https://x"}, UpdateMask: mask("webhook_url")}, true, ""},
		{"update name", own, "/locks.v1.ClientService/UpdateClient",
			&locksv1.UpdateClientRequest{Id: "cl_a", Client: &locksv1.Client{Name: "n"}, UpdateMask: mask("name")}, true, ""},
		{"update without mask", own, "/locks.v1.ClientService/UpdateClient",
			&locksv1.UpdateClientRequest{Id: "cl_a", Client: &locksv1.Client{WebhookUrl: "https://x"}}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := decide(tc.p, tc.method, tc.req)
			if (v.err != nil) != tc.deny {
				t.Fatalf("denied: %v, want denied %v", v.err, tc.deny)
			}
			if v.err != nil && !errors.Is(v.err, ErrPermissionDenied) {
				t.Fatalf("%v is not ErrPermissionDenied", v.err)
			}
			if v.sensor != tc.sensor {
				t.Fatalf("sensor to check %q, want %q", v.sensor, tc.sensor)
			}
		})
	}
}

// TestPermissionsCoverEveryMethod: every method the server serves has a row (a method
// without one would be admin-only by default, silently), and every row a served method.
func TestPermissionsCoverEveryMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	served := map[string]bool{}
	for svc, info := range e.srv.grpc.GetServiceInfo() {
		if strings.HasPrefix(svc, "grpc.reflection.") {
			continue
		}
		for _, m := range info.Methods {
			served["/"+svc+"/"+m.Name] = true
		}
	}
	for m := range served {
		if _, ok := permissionOf[m]; !ok {
			t.Errorf("%s has no row in permissions", m)
		}
	}
	for _, p := range permissions {
		if !served[p.Method] {
			t.Errorf("permissions lists %s, which the server does not serve", p.Method)
		}
	}
}

// TestPermissionsNameEveryRESTRoute: the table's REST column is each method's route as the
// gateway serves it (the OpenAPI description), and every route of the REST API has its row,
// so the permission matrix calls every REST route.
func TestPermissionsNameEveryRESTRoute(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(locksv1.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	served := map[string]string{} // "/locks.v1.Service/Method" → "METHOD /path"
	for path, ops := range doc.Paths {
		for method, op := range ops {
			svc, name, _ := strings.Cut(op.OperationID, "_")
			served["/locks.v1."+svc+"/"+name] = strings.ToUpper(method) + " " + path
		}
	}
	listed := map[string]bool{}
	for _, p := range permissions {
		listed[p.Method] = true
		if got, ok := served[p.Method]; !ok || got != p.REST {
			t.Errorf("%s: the table says %q, the REST API serves it at %q", p.Method, p.REST, got)
		}
	}
	for m, route := range served {
		if !listed[m] {
			t.Errorf("the REST route %s (%s) has no row in permissions", route, m)
		}
	}
}

// TestPermissionsDocumented: docs/contract.md prints the table the code enforces.
func TestPermissionsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), permissionsMarkdown()) {
		t.Fatalf("docs/contract.md does not hold the permission table; put this in it:\n%s", permissionsMarkdown())
	}
}

// tokenFixture is a server with clients and sensors to call the API about.
type tokenFixture struct {
	*env
	a, b, c         string // clients: a has a token, b another, c is the administrator's to change
	tokA, tokB, rev string // client tokens: a's, b's, and a deleted one of a
}

func newTokenFixture(t *testing.T, opts ...envOpt) *tokenFixture {
	e := newEnv(t, append([]envOpt{withPrivateWebhooks()}, opts...)...)
	f := &tokenFixture{env: e}
	f.a, f.b, f.c = f.mkClient("a"), f.mkClient("b"), f.mkClient("c")
	for _, s := range []string{"s1", "s2", "s3"} {
		e.want(e.do("POST", "/v1/sensors", map[string]any{"id": s, "address": "Street " + s}), 200)
	}
	e.want(e.do("PUT", "/v1/sensors/s1/clients/"+f.a, map[string]any{}), 200)
	e.want(e.do("PUT", "/v1/sensors/s2/clients/"+f.b, map[string]any{}), 200)
	e.want(e.do("PUT", "/v1/sensors/s3/clients/"+f.c, map[string]any{}), 200)
	f.tokA, _ = f.mkToken(f.a)
	f.tokB, _ = f.mkToken(f.b)
	var revID string
	f.rev, revID = f.mkToken(f.a)
	e.want(e.do("DELETE", "/v1/clients/"+f.a+"/tokens/"+revID, nil), 200)
	return f
}

func (f *tokenFixture) mkClient(name string) string {
	r := f.want(f.do("POST", "/v1/clients", map[string]any{"name": name, "webhook_url": "http://127.0.0.1:9/" + name}), 200)
	return r.str("id")
}

func (f *tokenFixture) mkToken(client string) (token, id string) {
	r := f.want(f.do("POST", "/v1/clients/"+client+"/tokens", map[string]any{"name": "token of " + client}), 200)
	if !strings.HasPrefix(r.str("token"), clientTokenPrefix) || r.str("token_id") == "" {
		f.t.Fatalf("token answer: %s", r.raw)
	}
	return r.str("token"), r.str("token_id")
}

// callREST makes row p's REST call about client and sensor with token, returning the
// status and the error message.
func (f *tokenFixture) callREST(p permission, token, client, sensor string) (int, string) {
	method, path, _ := strings.Cut(p.REST, " ")
	onClient := strings.HasPrefix(path, "/v1/clients")
	for k, v := range map[string]string{"{client_id}": client, "{sensor_id}": sensor, "{event_id}": "evt_x",
		"{token_id}": "tok_x", "{name}": "state"} {
		path = strings.ReplaceAll(path, k, v)
	}
	if onClient {
		path = strings.ReplaceAll(path, "{id}", client)
	} else {
		path = strings.ReplaceAll(path, "{id}", sensor)
	}
	var body any
	switch {
	case p.Method == "/locks.v1.ClientService/UpdateClient":
		body = map[string]any{"webhook_url": "http://127.0.0.1:9/changed"}
	case method != "GET" && method != "DELETE":
		body = map[string]any{}
	}
	hdr := []string{"Authorization", ""}
	if token != "" {
		hdr[1] = "Bearer " + token
	}
	if strings.HasSuffix(path, ":watch") {
		return f.openWatch(path, token)
	}
	r := f.do(method, path, body, hdr...)
	return r.status, r.str("message")
}

// openWatch opens a REST watch and hangs up once it has the status (and an error's message).
func (f *tokenFixture) openWatch(path, token string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", f.url+path, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := f.http.Do(req)
	if err != nil {
		f.t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return res.StatusCode, ""
	}
	var body struct {
		Message string `json:"message"`
		Error   struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.NewDecoder(res.Body).Decode(&body)
	return res.StatusCode, body.Message + body.Error.Message
}

// callGRPC makes row p's gRPC call the same way.
func (f *tokenFixture) callGRPC(t *testing.T, p permission, token, client, sensor string) (codes.Code, string) {
	svc, name, _ := strings.Cut(strings.TrimPrefix(p.Method, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		t.Fatal(err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	in, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		t.Fatal(err)
	}
	out, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		t.Fatal(err)
	}
	req := in.New()
	onClient := strings.HasPrefix(strings.Fields(p.REST)[1], "/v1/clients")
	for field, v := range map[string]string{"client_id": client, "sensor_id": sensor, "event_id": "evt_x", "token_id": "tok_x", "name": "x"} {
		if fd := req.Descriptor().Fields().ByName(protoreflect.Name(field)); fd != nil && fd.Kind() == protoreflect.StringKind {
			req.Set(fd, protoreflect.ValueOfString(v))
		}
	}
	if fd := req.Descriptor().Fields().ByName("id"); fd != nil {
		if onClient {
			req.Set(fd, protoreflect.ValueOfString(client))
		} else {
			req.Set(fd, protoreflect.ValueOfString(sensor))
		}
	}
	if u, ok := req.Interface().(*locksv1.UpdateClientRequest); ok {
		u.Client = &locksv1.Client{WebhookUrl: "http://127.0.0.1:9/changed"}
		u.UpdateMask = &fieldmaskpb.FieldMask{Paths: []string{"webhook_url"}}
	}
	ctx := t.Context()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	if md.IsStreamingServer() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cs, err := f.raw.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, p.Method)
		if err == nil {
			err = cs.SendMsg(req.Interface())
		}
		if err == nil {
			err = cs.CloseSend()
		}
		if err == nil {
			var h metadata.MD
			if h, err = cs.Header(); err == nil && len(h.Get(watchOpenHeader)) > 0 {
				return codes.OK, ""
			}
			err = cs.RecvMsg(out.New().Interface())
		}
		st, _ := status.FromError(err)
		return st.Code(), st.Message()
	}
	err = f.raw.Invoke(ctx, p.Method, req.Interface(), out.New().Interface())
	st, _ := status.FromError(err)
	return st.Code(), st.Message()
}

// TestPermissionMatrix calls every REST route and gRPC method of the permission table with
// an administrator token, the right client's token, another client's token, a deleted token
// and no token.
func TestPermissionMatrix(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	const missingClient, missingSensor = "cl_aaaaaaaaaaaaaaaaaaaa", "nosuchsensor"
	for _, p := range permissions {
		t.Run(strings.TrimPrefix(p.Method, "/locks.v1."), func(t *testing.T) {
			f := &tokenFixture{env: f.with(t), a: f.a, b: f.b, c: f.c, tokA: f.tokA, tokB: f.tokB, rev: f.rev}
			// No token and a deleted one: 401 whatever is asked.
			for _, tok := range []string{"", f.rev} {
				if st, msg := f.callREST(p, tok, f.a, "s1"); st != http.StatusUnauthorized {
					t.Errorf("REST, token %q: %d %s, want 401", tok, st, msg)
				}
				if c, msg := f.callGRPC(t, p, tok, f.a, "s1"); c != codes.Unauthenticated {
					t.Errorf("gRPC, token %q: %s %s, want UNAUTHENTICATED", tok, c, msg)
				}
			}
			// The right client's token on its own client and subscribed sensor.
			st, msg := f.callREST(p, f.tokA, f.a, "s1")
			c, gmsg := f.callGRPC(t, p, f.tokA, f.a, "s1")
			if p.Access == adminOnly {
				if st != http.StatusForbidden || c != codes.PermissionDenied {
					t.Errorf("own client: REST %d %s, gRPC %s %s; want 403 / PERMISSION_DENIED", st, msg, c, gmsg)
				}
			} else if st == http.StatusUnauthorized || st == http.StatusForbidden || c == codes.Unauthenticated || c == codes.PermissionDenied {
				t.Errorf("own client: REST %d %s, gRPC %s %s; want allowed", st, msg, c, gmsg)
			}
			// Another client's token on a's client and sensor; a's token on b's (which
			// exist) and on a client and sensor that do not: all the same 403.
			type answer struct {
				st   int
				msg  string
				c    codes.Code
				gmsg string
			}
			var answers []answer
			for _, call := range []struct{ tok, client, sensor string }{
				{f.tokB, f.a, "s1"}, {f.tokA, f.b, "s2"}, {f.tokA, missingClient, missingSensor},
			} {
				st, msg := f.callREST(p, call.tok, call.client, call.sensor)
				c, gmsg := f.callGRPC(t, p, call.tok, call.client, call.sensor)
				if st != http.StatusForbidden || c != codes.PermissionDenied {
					t.Errorf("%+v: REST %d %s, gRPC %s %s; want 403 / PERMISSION_DENIED", call, st, msg, c, gmsg)
				}
				answers = append(answers, answer{st, msg, c, gmsg})
			}
			if answers[1] != answers[2] {
				t.Errorf("existing and missing resources answered differently: %+v and %+v", answers[1], answers[2])
			}
			// The administrator: on c and s3, whose changes harm no other row.
			if st, msg := f.callREST(p, testToken, f.c, "s3"); st == http.StatusUnauthorized || st == http.StatusForbidden {
				t.Errorf("administrator REST: %d %s", st, msg)
			}
			if c, msg := f.callGRPC(t, p, testToken, f.c, "s3"); c == codes.Unauthenticated || c == codes.PermissionDenied {
				t.Errorf("administrator gRPC: %s %s", c, msg)
			}
		})
	}
}

// TestClientTokenRevocation: a deleted token is refused at once by every API instance.
func TestClientTokenRevocation(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	other := newEnv(t, sharedDB(f.db), withPrivateWebhooks())
	tok, id := f.mkToken(f.a)
	get := func(e *env) int { return e.do("GET", "/v1/clients/"+f.a, nil, "Authorization", "Bearer "+tok).status }
	getGRPC := func(e *env) codes.Code {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tok)
		_, err := locksv1.NewClientServiceClient(e.raw).GetClient(ctx, &locksv1.GetClientRequest{Id: f.a})
		return status.Code(err)
	}
	for _, e := range []*env{f.env, other} {
		if st := get(e); st != 200 {
			t.Fatalf("before deletion: %d", st)
		}
		if c := getGRPC(e); c != codes.OK {
			t.Fatalf("before deletion: %s", c)
		}
	}
	f.want(f.do("DELETE", "/v1/clients/"+f.a+"/tokens/"+id, nil), 200)
	for _, e := range []*env{other, f.env} {
		if st := get(e); st != 401 {
			t.Fatalf("after deletion: %d, want 401", st)
		}
		if c := getGRPC(e); c != codes.Unauthenticated {
			t.Fatalf("after deletion: %s, want UNAUTHENTICATED", c)
		}
	}
	f.want(f.do("DELETE", "/v1/clients/"+f.a+"/tokens/"+id, nil), 404)
}

// TestClientTokens: create, list (never the token), last use recorded without a write per
// call, tokens of one client apart from another's.
func TestClientTokens(t *testing.T) {
	t.Parallel()
	f := newTokenFixture(t)
	list := func(client string) []any {
		r := f.want(f.do("GET", "/v1/clients/"+client+"/tokens", nil), 200)
		if strings.Contains(string(r.raw), clientTokenPrefix) {
			t.Fatalf("a token list shows a token: %s", r.raw)
		}
		ts, _ := r.body["tokens"].([]any)
		return ts
	}
	if n := len(list(f.a)); n != 1 { // the deleted one is gone
		t.Fatalf("client a has %d tokens, want 1", n)
	}
	if n := len(list(f.c)); n != 0 {
		t.Fatalf("client c has %d tokens, want 0", n)
	}
	used := func() string {
		var at *time.Time
		if err := f.db.QueryRow(t.Context(), `SELECT last_used_at FROM client_tokens WHERE client_id = $1`, f.a).Scan(&at); err != nil {
			t.Fatal(err)
		}
		if at == nil {
			return ""
		}
		return at.String()
	}
	f.want(f.do("GET", "/v1/clients/"+f.a, nil, "Authorization", "Bearer "+f.tokA), 200)
	first := used()
	if first == "" {
		t.Fatal("last_used_at not recorded")
	}
	if _, ok := list(f.a)[0].(map[string]any)["last_used_time"].(string); !ok {
		t.Fatalf("list shows no last_used_time: %v", list(f.a))
	}
	for range 5 {
		f.want(f.do("GET", "/v1/clients/"+f.a, nil, "Authorization", "Bearer "+f.tokA), 200)
	}
	if again := used(); again != first {
		t.Fatalf("last_used_at rewritten within a minute: %s then %s", first, again)
	}
	f.want(f.do("POST", "/v1/clients/"+f.a+"/tokens", map[string]any{"name": ""}), 400)
	f.want(f.do("POST", "/v1/clients/cl_aaaaaaaaaaaaaaaaaaaa/tokens", map[string]any{"name": "x"}), 404)
	// A client token changes its webhook_url, not its name.
	r := f.want(f.do("PATCH", "/v1/clients/"+f.a, map[string]any{"webhook_url": "http://127.0.0.1:9/new"}, "Authorization", "Bearer "+f.tokA), 200)
	if r.str("webhook_url") != "http://127.0.0.1:9/new" {
		t.Fatalf("update: %s", r.raw)
	}
	f.want(f.do("PATCH", "/v1/clients/"+f.a, map[string]any{"name": "mine"}, "Authorization", "Bearer "+f.tokA), 403)
	// Deleting the client deletes its tokens.
	f.want(f.do("DELETE", "/v1/clients/"+f.a, nil), 200)
	f.want(f.do("GET", "/v1/clients/"+f.a, nil, "Authorization", "Bearer "+f.tokA), 401)
}
