package api

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/lock-sensors/lock-sensors/internal/netguard"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

func TestCheckWebhookURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url          string
		allowPrivate bool
		want         string // "" = accepted, else a word of the reason
	}{
		{"https://203.0.113.7/hook", false, ""},
		{"http://203.0.113.7:8080/a/b?c=d", false, ""},
		{"https://[2a00:1450:4001:82a::200e]/hook", false, ""},
		{"", false, "required"},
		{"/relative/path", false, "absolute"},
		{"203.0.113.7/hook", false, "absolute"},
		{"ftp://203.0.113.7/", false, "scheme"},
		{"javascript:alert(1)", false, "scheme"},
		{"https:opaque", false, "host"},
		{"https:///nohost", false, "host"},
		{"https://user:pw@203.0.113.7/", false, "user info"},
		{"https://user@203.0.113.7/", false, "user info"},
		{"https://203.0.113.7/#frag", false, "fragment"},
		{"https://203.0.113.7:0/", false, "port"},
		{"https://203.0.113.7:70000/", false, "port"},
		{"https://203.0.113.7:abc/", false, "URL"},
		{"http://[::1", false, "URL"},
		{"https://" + strings.Repeat("a", 2100) + ".com/", false, "at most"},
		{"http://127.0.0.1/", false, "loopback"},
		{"http://127.1.2.3:9000/", false, "loopback"},
		{"http://[::1]/", false, "loopback"},
		{"http://[::ffff:127.0.0.1]/", false, "loopback"},
		{"http://10.1.2.3/", false, "private"},
		{"http://172.16.0.1/", false, "private"},
		{"http://192.168.1.1/", false, "private"},
		{"http://[fd00::1]/", false, "private"},
		{"http://169.254.169.254/latest/meta-data", false, "link-local"},
		{"http://[fe80::1%25eth0]/", false, "link-local"},
		{"http://0.0.0.0/", false, "unspecified"},
		{"http://[::]/", false, "unspecified"},
		{"http://100.64.0.1/", false, "carrier-grade NAT"},
		{"http://198.18.0.1/", false, "benchmarking"},
		{"http://192.0.0.8/", false, "IETF"},
		{"http://240.0.0.1/", false, "reserved"},
		{"http://255.255.255.255/", false, "broadcast"},
		{"http://[fec0::1]/", false, "site-local"},
		{"http://[64:ff9b::a00:1]/", false, "NAT64 form of 10.0.0.1"},
		{"http://[2002:7f00:1::1]/", false, "6to4 form of 127.0.0.1"},
		{"http://[::10.0.0.1]/", false, "IPv4-compatible form of 10.0.0.1"},
		{"http://[::ffff:192.168.0.1]/", false, "private"},
		{"http://[64:ff9b::808:808]/", false, ""},
		{"http://[2002:808:808::1]/", false, ""},
		{"http://239.1.2.3/", false, "multicast"},
		{"http://localhost:8080/", false, "loopback"},
		{"http://LOCALHOST./", false, "loopback"},
		{"http://api.localhost/", false, "loopback"},
		{"http://no-such-host.invalid/", false, "resolve"},
		// Allowed when private addresses are.
		{"http://127.0.0.1:8080/", true, ""},
		{"http://localhost/", true, ""},
		{"http://10.0.0.1/", true, ""},
		{"https://user@10.0.0.1/", true, "user info"},
		{"ftp://10.0.0.1/", true, "scheme"},
	} {
		err := checkWebhookURL(t.Context(), c.url, c.allowPrivate, net.DefaultResolver)
		var fe *FieldError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q (allowPrivate=%v): refused: %v", c.url, c.allowPrivate, err)
		case c.want != "" && err == nil:
			t.Errorf("%q (allowPrivate=%v): accepted, want refused (%s)", c.url, c.allowPrivate, c.want)
		case c.want != "" && (!errors.As(err, &fe) || fe.Field != "webhook_url" || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: %v, want a webhook_url error about %q", c.url, err, c.want)
		}
	}
}

// A name is judged by what it really resolves to: this machine's own name, through the
// system's resolver (usually /etc/hosts → a loopback or private address).
func TestCheckWebhookURLResolves(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(t.Context(), "ip", host)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("this machine's name %q does not resolve (%v); the test needs it to", host, err)
	}
	public := true
	for _, a := range addrs {
		public = public && netguard.Reason(a) == ""
	}
	err = checkWebhookURL(t.Context(), "https://"+host+"/hook", false, net.DefaultResolver)
	if public && err != nil {
		t.Fatalf("%s resolves to public %v but was refused: %v", host, addrs, err)
	}
	if !public && (err == nil || !strings.Contains(err.Error(), "resolves to")) {
		t.Fatalf("%s resolves to %v, not all public, but got %v", host, addrs, err)
	}
	if err := checkWebhookURL(t.Context(), "https://"+host+"/hook", true, net.DefaultResolver); err != nil {
		t.Fatalf("allowed private: %v", err)
	}
}

// badInput is one invalid call and the field its 400 must name.
type badInput struct {
	name   string
	method string
	path   string
	body   any
	field  string
}

// Bad inputs of each create and update call, over REST: each is a 400 naming the field, and
// none changes anything.
func TestRESTBadInputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "Good1", "address": "Somewhere"}), 200)
	cl := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "C", "webhook_url": "https://203.0.113.1/"}), 200).str("id")
	long := func(n int) string { return strings.Repeat("é", n) }
	type m = map[string]any
	rows := []badInput{
		// Create a sensor.
		{"sensor no id", "POST", "/v1/sensors", m{"address": "x"}, "id"},
		{"sensor id too long", "POST", "/v1/sensors", m{"id": "abcdefghijklmnopq", "address": "x"}, "id"},
		{"sensor id with dash", "POST", "/v1/sensors", m{"id": "a-b", "address": "x"}, "id"},
		{"sensor id with space", "POST", "/v1/sensors", m{"id": "a b", "address": "x"}, "id"},
		{"sensor id not ASCII", "POST", "/v1/sensors", m{"id": "Ñandú", "address": "x"}, "id"},
		{"sensor id number", "POST", "/v1/sensors", `{"id": 12, "address": "x"}`, "id"},
		{"sensor no address", "POST", "/v1/sensors", m{"id": "S1"}, "address"},
		{"sensor blank address", "POST", "/v1/sensors", m{"id": "S1", "address": "   "}, "address"},
		{"sensor address too long", "POST", "/v1/sensors", m{"id": "S1", "address": long(513)}, "address"},
		{"sensor address newline", "POST", "/v1/sensors", m{"id": "S1", "address": "a\nb"}, "address"},
		{"sensor address bidi override", "POST", "/v1/sensors", m{"id": "S1", "address": "room \u202e61 ,rif"}, "address"},
		{"sensor address bidi isolate", "POST", "/v1/sensors", m{"id": "S1", "address": "a\u2067b\u2069"}, "address"},
		{"sensor address zero-width space", "POST", "/v1/sensors", m{"id": "S1", "address": "Svobody\u200b st. 23"}, "address"},
		{"sensor address zero-width joiner", "POST", "/v1/sensors", m{"id": "S1", "address": "a\u200db"}, "address"},
		{"sensor address BOM", "POST", "/v1/sensors", m{"id": "S1", "address": "\ufeffa"}, "address"},
		{"sensor address line separator", "POST", "/v1/sensors", m{"id": "S1", "address": "a\u2028b"}, "address"},
		{"patch sensor address left-to-right mark", "PATCH", "/v1/sensors/Good1", m{"address": "a\u200eb"}, "address"},
		{"sensor lost_after zero", "POST", "/v1/sensors", m{"id": "S1", "address": "x", "lost_after": "0s"}, "lost_after"},
		{"sensor lost_after negative", "POST", "/v1/sensors", m{"id": "S1", "address": "x", "lost_after": "-5s"}, "lost_after"},
		{"sensor lost_after too long", "POST", "/v1/sensors", m{"id": "S1", "address": "x", "lost_after": "40000000s"}, "lost_after"},
		{"sensor lost_after not a duration", "POST", "/v1/sensors", m{"id": "S1", "address": "x", "lost_after": "1h"}, "lost_after"},
		{"sensor unknown field", "POST", "/v1/sensors", m{"id": "S1", "adress": "x"}, "adress"},
		{"sensor not JSON", "POST", "/v1/sensors", `id=S1`, ""},
		{"sensor array", "POST", "/v1/sensors", `[]`, ""},
		// Update a sensor.
		{"patch sensor blank address", "PATCH", "/v1/sensors/Good1", m{"address": ""}, "address"},
		{"patch sensor address too long", "PATCH", "/v1/sensors/Good1", m{"address": long(600)}, "address"},
		{"patch sensor lost_after", "PATCH", "/v1/sensors/Good1", m{"lost_after": "0.1s"}, "lost_after"},
		{"patch sensor other id", "PATCH", "/v1/sensors/Good1", m{"id": "Good2", "address": "y"}, "id"},
		{"patch sensor bad path id", "PATCH", "/v1/sensors/bad-id", m{"address": "y"}, "id"},
		{"patch sensor mask", "PATCH", "/v1/sensors/Good1?update_mask=colour", m{"address": "y"}, "update_mask"},
		{"patch sensor state", "PATCH", "/v1/sensors/Good1", m{"state": "open"}, "state"},
		// Create a client.
		{"client no name", "POST", "/v1/clients", m{"webhook_url": "https://203.0.113.1/"}, "name"},
		{"client name too long", "POST", "/v1/clients", m{"name": long(201), "webhook_url": "https://203.0.113.1/"}, "name"},
		{"client name tab", "POST", "/v1/clients", m{"name": "a\tb", "webhook_url": "https://203.0.113.1/"}, "name"},
		{"client name bidi override", "POST", "/v1/clients", m{"name": "invoice\u202efdp.exe", "webhook_url": "https://203.0.113.1/"}, "name"},
		{"client name zero-width", "POST", "/v1/clients", m{"name": "ad\u200cmin", "webhook_url": "https://203.0.113.1/"}, "name"},
		{"client no url", "POST", "/v1/clients", m{"name": "n"}, "webhook_url"},
		{"client relative url", "POST", "/v1/clients", m{"name": "n", "webhook_url": "/hook"}, "webhook_url"},
		{"client url user info", "POST", "/v1/clients", m{"name": "n", "webhook_url": "https://a:b@203.0.113.1/"}, "webhook_url"},
		{"client url loopback", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://localhost:9/"}, "webhook_url"},
		{"client url private", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://192.168.0.10/"}, "webhook_url"},
		{"client url metadata", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://169.254.169.254/"}, "webhook_url"},
		{"client url benchmarking", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://198.18.0.1/"}, "webhook_url"},
		{"client url NAT64", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://[64:ff9b::a9fe:a9fe]/"}, "webhook_url"},
		{"client url 6to4", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://[2002:7f00:1::1]/"}, "webhook_url"},
		{"client url IPv4-compatible", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://[::192.168.0.10]/"}, "webhook_url"},
		{"client url site-local", "POST", "/v1/clients", m{"name": "n", "webhook_url": "http://[fec0::1]/"}, "webhook_url"},
		{"client url scheme", "POST", "/v1/clients", m{"name": "n", "webhook_url": "gopher://203.0.113.1/"}, "webhook_url"},
		// Update a client.
		{"patch client blank name", "PATCH", "/v1/clients/" + cl, m{"name": " "}, "name"},
		{"patch client name bidi", "PATCH", "/v1/clients/" + cl, m{"name": "a\u2066b"}, "name"},
		{"patch client url", "PATCH", "/v1/clients/" + cl, m{"webhook_url": "http://10.0.0.1/"}, "webhook_url"},
		{"patch client other id", "PATCH", "/v1/clients/" + cl, m{"id": "cl_other", "name": "y"}, "id"},
		{"patch client mask", "PATCH", "/v1/clients/" + cl + "?update_mask=secret", m{"name": "y"}, "update_mask"},
		{"patch client bad path id", "PATCH", "/v1/clients/a.b", m{"name": "y"}, "id"},
		// Subscribe.
		{"subscribe bad sensor id", "PUT", "/v1/sensors/a_b/clients/" + cl, nil, "sensor_id"},
		{"subscribe bad client id", "PUT", "/v1/sensors/Good1/clients/a.b", nil, "client_id"},
		// Lists.
		{"negative page_size", "GET", "/v1/clients?page_size=-5", nil, "page_size"},
		{"page_size not a number", "GET", "/v1/clients?page_size=ten", nil, "page_size"},
		{"page_token garbage", "GET", "/v1/clients?page_token=%25%25%25", nil, "page_token"},
		{"data filter 7", "GET", "/v1/sensors?data=7", nil, "data"},
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, c.body)
			if r.status != 400 {
				t.Fatalf("status %d, want 400: %s", r.status, r.raw)
			}
			if c.field != "" && !strings.Contains(r.str("message"), c.field) {
				t.Fatalf("message %q does not name %s", r.str("message"), c.field)
			}
		})
	}
	// Nothing was changed by any of them.
	r := e.want(e.do("GET", "/v1/sensors/Good1", nil), 200)
	if r.str("address") != "Somewhere" || r.body["lost_after"] != nil {
		t.Fatalf("sensor changed: %s", r.raw)
	}
	if n := e.count(`SELECT count(*) FROM sensors`) + e.count(`SELECT count(*) FROM clients`) + e.count(`SELECT count(*) FROM subscriptions`); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// The same calls over gRPC are INVALID_ARGUMENT with a BadRequest detail naming the field.
func TestGRPCBadInputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "Good1", Address: "x"}}); err != nil {
		t.Fatal(err)
	}
	c, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "C", WebhookUrl: "https://203.0.113.1/"}})
	if err != nil {
		t.Fatal(err)
	}
	cl := c.GetClient().GetId()
	mask := func(p ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: p} }
	for _, r := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"create sensor nil", func() error { _, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{}); return err }, "sensor"},
		{"create sensor id", func() error {
			_, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "x y", Address: "a"}})
			return err
		}, "id"},
		{"create sensor address", func() error {
			_, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "S9", Address: strings.Repeat("a", 513)}})
			return err
		}, "address"},
		{"create sensor invalid duration", func() error {
			_, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: "S9", Address: "a", LostAfter: &durationpb.Duration{Seconds: 5, Nanos: -1}}})
			return err
		}, "lost_after"},
		{"update sensor nil", func() error {
			_, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "Good1"})
			return err
		}, "sensor"},
		{"update sensor no id", func() error {
			_, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Sensor: &locksv1.Sensor{Address: "b"}})
			return err
		}, "id"},
		{"update sensor empty mask blank address", func() error {
			_, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "Good1", Sensor: &locksv1.Sensor{LostAfter: durationpb.New(60e9)}})
			return err
		}, "address"},
		{"update sensor mask", func() error {
			_, err := e.sensors.UpdateSensor(ctx, &locksv1.UpdateSensorRequest{Id: "Good1", Sensor: &locksv1.Sensor{Address: "b"}, UpdateMask: mask("address", "owner")})
			return err
		}, "update_mask"},
		{"create client name", func() error {
			_, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: strings.Repeat("n", 201), WebhookUrl: "https://203.0.113.1/"}})
			return err
		}, "name"},
		{"create client url", func() error {
			_, err := e.clients.CreateClient(ctx, &locksv1.CreateClientRequest{Client: &locksv1.Client{Name: "n", WebhookUrl: "http://[::1]:80/"}})
			return err
		}, "webhook_url"},
		{"update client url", func() error {
			_, err := e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl, Client: &locksv1.Client{WebhookUrl: "https://x@203.0.113.1/"}, UpdateMask: mask("webhook_url")})
			return err
		}, "webhook_url"},
		{"update client other id", func() error {
			_, err := e.clients.UpdateClient(ctx, &locksv1.UpdateClientRequest{Id: cl, Client: &locksv1.Client{Id: "cl_z", Name: "n"}, UpdateMask: mask("name")})
			return err
		}, "id"},
		{"subscribe no client", func() error {
			_, err := e.subs.CreateSubscription(ctx, &locksv1.CreateSubscriptionRequest{SensorId: "Good1"})
			return err
		}, "client_id"},
		{"list page size", func() error {
			_, err := e.clients.ListClients(ctx, &locksv1.ListClientsRequest{PageSize: -1})
			return err
		}, "page_size"},
		{"list connection", func() error {
			_, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{Connection: 9})
			return err
		}, "connection"},
	} {
		t.Run(r.name, func(t *testing.T) {
			if f := fieldViolation(t, r.call()); f != r.field {
				t.Fatalf("field %q, want %q", f, r.field)
			}
		})
	}
}
