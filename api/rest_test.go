package api

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Every call over REST, in the order an operator would make them, with each error status
// of docs/contract.md section 3 on the way.
func TestRESTLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// Clients.
	r := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "Front desk", "webhook_url": "https://203.0.113.10/hook"}), 200)
	cl := r.body
	clID := r.str("id")
	if !strings.HasPrefix(clID, "cl_") || len(clID) != 23 {
		t.Fatalf("client id %q", clID)
	}
	secret := r.str("signing_secret")
	if b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_")); !strings.HasPrefix(secret, "whsec_") || err != nil || len(b) != 32 {
		t.Fatalf("signing_secret %q: want whsec_ + base64 of 32 bytes (%v)", secret, err)
	}
	if r.header.Get("ETag") != `"`+r.str("etag")+`"` || r.str("etag") == "" {
		t.Fatalf("ETag header %q, etag %q", r.header.Get("ETag"), r.str("etag"))
	}
	for _, k := range []string{"name", "webhook_url", "create_time", "update_time"} {
		if cl[k] == nil || cl[k] == "" {
			t.Fatalf("client has no %s: %s", k, r.raw)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, r.str("create_time")); err != nil {
		t.Fatalf("create_time is not RFC 3339: %v", err)
	}
	r = e.want(e.do("POST", "/v1/clients", map[string]any{"name": "", "webhook_url": "https://203.0.113.10/hook"}), 400, "name")
	if fieldOf(r) != "name" {
		t.Fatalf("field %q: %s", fieldOf(r), r.raw)
	}
	e.want(e.do("POST", "/v1/clients", map[string]any{"name": "x", "webhook_url": "https://127.0.0.1/hook"}), 400, "webhook_url", "LOCKS_WEBHOOK_ALLOW_PRIVATE")
	e.want(e.do("POST", "/v1/clients", `{"name": "x", "webhook_url": "https://203.0.113.10/", "colour": "red"}`), 400, "colour")
	e.want(e.do("POST", "/v1/clients", `{"name": `), 400)

	r = e.want(e.do("GET", "/v1/clients/"+clID, nil), 200)
	if r.str("signing_secret") != secret || r.str("name") != "Front desk" {
		t.Fatalf("get client: %s", r.raw)
	}
	etag1 := r.str("etag")
	e.want(e.do("GET", "/v1/clients/cl_nosuchclient0000000", nil), 404, "cl_nosuchclient0000000")
	e.want(e.do("GET", "/v1/clients/bad%20id", nil), 400, "id")

	r = e.want(e.do("GET", "/v1/clients", nil), 200)
	if list, _ := r.body["clients"].([]any); len(list) != 1 || list[0].(map[string]any)["signing_secret"] != "" {
		t.Fatalf("list clients: %s", r.raw)
	}
	if r.body["next_page_token"] != "" {
		t.Fatalf("one page only: %s", r.raw)
	}

	// PATCH changes only the fields in the body; a stale etag (body or If-Match) is 412.
	r = e.want(e.do("PATCH", "/v1/clients/"+clID, map[string]any{"name": "Reception"}), 200)
	if r.str("name") != "Reception" || r.str("webhook_url") != "https://203.0.113.10/hook" || r.str("etag") == etag1 {
		t.Fatalf("patch name: %s", r.raw)
	}
	etag2 := r.str("etag")
	e.want(e.do("PATCH", "/v1/clients/"+clID, map[string]any{"name": "Stale", "etag": etag1}), 412, clID)
	e.want(e.do("PATCH", "/v1/clients/"+clID, map[string]any{"name": "Stale"}, "If-Match", `"`+etag1+`"`), 412)
	r = e.want(e.do("PATCH", "/v1/clients/"+clID, map[string]any{"webhook_url": "http://203.0.113.11:8080/h"}, "If-Match", `"`+etag2+`"`), 200)
	if r.str("name") != "Reception" || r.str("webhook_url") != "http://203.0.113.11:8080/h" {
		t.Fatalf("patch webhook_url: %s", r.raw)
	}
	e.want(e.do("PATCH", "/v1/clients/"+clID, map[string]any{"webhook_url": "ftp://203.0.113.11/"}), 400, "webhook_url")
	e.want(e.do("PATCH", "/v1/clients/cl_nosuchclient0000000", map[string]any{"name": "x"}), 404)

	// Rotation keeps the old secret signing for 24 h.
	r = e.want(e.do("POST", "/v1/clients/"+clID+":rotateSecret", map[string]any{}), 200)
	if r.str("signing_secret") == secret || r.str("previous_secret") != secret {
		t.Fatalf("rotate: %s", r.raw)
	}
	until, err := time.Parse(time.RFC3339Nano, r.str("previous_secret_until"))
	if err != nil || until.Sub(time.Now()) < 23*time.Hour || until.Sub(time.Now()) > 25*time.Hour {
		t.Fatalf("previous_secret_until %q (%v): want about now + 24h", r.str("previous_secret_until"), err)
	}
	e.want(e.do("POST", "/v1/clients/"+clID+":rotateSecret", map[string]any{"etag": etag2}), 412)
	clEtag := r.str("etag")

	// Sensors.
	r = e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "xa7v9Dfadr7H", "address": "Moscow, Russia, Svobody st. 23 fl 1 room 16"}), 200)
	if r.str("id") != "xa7v9Dfadr7H" || r.body["state"] != nil || r.body["lost_after"] != nil {
		t.Fatalf("create sensor: %s", r.raw)
	}
	sEtag := r.str("etag")
	e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "xa7v9Dfadr7H", "address": "again"}), 409, "xa7v9Dfadr7H")
	r = e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "no-dashes", "address": "x"}), 400, "id")
	if fieldOf(r) != "id" {
		t.Fatalf("field %q", fieldOf(r))
	}
	e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "S2", "address": "Hall", "lost_after": "90s"}), 200)
	e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "S3", "address": "Yard"}), 200)

	r = e.want(e.do("GET", "/v1/sensors/S2", nil), 200)
	if r.str("lost_after") != "90s" || r.str("address") != "Hall" {
		t.Fatalf("get sensor: %s", r.raw)
	}
	e.want(e.do("GET", "/v1/sensors/Nope", nil), 404, "Nope")
	e.want(e.do("GET", "/v1/sensors/waytoolongsensorid", nil), 400, "id")

	// State: 404 until a reading was seen; then read from the projection, also in the sensor.
	e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H/state", nil), 404, "no reading")
	e.setState("xa7v9Dfadr7H", 0, "online", 7)
	e.setState("S3", 1, "lost", 2)
	e.setState("Unregistered1", 0, "lost", 1)
	r = e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H/state", nil), 200)
	if r.body["data"] != float64(0) || r.str("connection") != "CONNECTION_ONLINE" || r.str("sensor_id") != "xa7v9Dfadr7H" || r.body["revision"] != "7" {
		t.Fatalf("state: %s", r.raw)
	}
	for _, k := range []string{"last_seen_time", "changed_time", "last_reading_time"} {
		if _, err := time.Parse(time.RFC3339Nano, r.str(k)); err != nil {
			t.Fatalf("%s %q is not RFC 3339", k, r.str(k))
		}
	}
	e.want(e.do("GET", "/v1/sensors/Unregistered1/state", nil), 200)
	r = e.want(e.do("GET", "/v1/sensors/S3", nil), 200)
	if st, _ := r.body["state"].(map[string]any); st["connection"] != "CONNECTION_LOST" || st["data"] != float64(1) {
		t.Fatalf("sensor's state: %s", r.raw)
	}

	// Filters by current state; unregistered sensors are not listed.
	for _, c := range []struct {
		query string
		want  string
	}{
		{"", "S2,S3,xa7v9Dfadr7H"},
		{"?connection=CONNECTION_LOST", "S3"},
		{"?connection=CONNECTION_ONLINE", "xa7v9Dfadr7H"},
		{"?data=0", "xa7v9Dfadr7H"},
		{"?data=1&connection=CONNECTION_LOST", "S3"},
		{"?data=0&connection=CONNECTION_LOST", ""},
	} {
		r = e.want(e.do("GET", "/v1/sensors"+c.query, nil), 200)
		var ids []string
		list, _ := r.body["sensors"].([]any)
		for _, s := range list {
			ids = append(ids, s.(map[string]any)["id"].(string))
		}
		if strings.Join(ids, ",") != c.want {
			t.Fatalf("GET /v1/sensors%s: %v, want %s", c.query, ids, c.want)
		}
	}
	e.want(e.do("GET", "/v1/sensors?data=2", nil), 400, "data")
	e.want(e.do("GET", "/v1/sensors?connection=CONNECTION_SLEEPY", nil), 400, "connection")
	e.want(e.do("GET", "/v1/sensors?page_size=-1", nil), 400, "page_size")
	e.want(e.do("GET", "/v1/sensors?page_token=bm9wZQ", nil), 400, "page_token")

	// Sensor updates: address, lost_after set and cleared; stale etag 412.
	r = e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", map[string]any{"lost_after": "300s", "etag": sEtag}), 200)
	if r.str("lost_after") != "300s" || r.str("address") != "Moscow, Russia, Svobody st. 23 fl 1 room 16" {
		t.Fatalf("patch lost_after: %s", r.raw)
	}
	e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", map[string]any{"address": "Elsewhere", "etag": sEtag}), 412)
	r = e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H?update_mask=lost_after", map[string]any{"address": "ignored, not in the mask"}), 200)
	if r.body["lost_after"] != nil || r.str("address") != "Moscow, Russia, Svobody st. 23 fl 1 room 16" {
		t.Fatalf("clear lost_after with a mask: %s", r.raw)
	}
	e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", map[string]any{"lost_after": "0.5s"}), 400, "lost_after")
	// An empty body changes nothing; a null clears lost_after back to the server's default.
	before := e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H", nil), 200)
	r = e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", `{}`), 200)
	if r.str("etag") != before.str("etag") || r.str("address") != before.str("address") {
		t.Fatalf("empty PATCH changed the sensor: %s", r.raw)
	}
	e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", map[string]any{"lost_after": "45s"}), 200)
	r = e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", `{"lost_after": null}`), 200)
	if r.body["lost_after"] != nil || r.str("address") != before.str("address") {
		t.Fatalf("PATCH lost_after null: %s", r.raw)
	}
	e.want(e.do("PATCH", "/v1/sensors/xa7v9Dfadr7H", map[string]any{"id": "Other"}), 400, "id")
	e.want(e.do("PATCH", "/v1/sensors/Nope", map[string]any{"address": "x"}), 404)
	// A sensor read with GET can be sent back whole (output-only fields are ignored).
	r = e.want(e.do("GET", "/v1/sensors/S3", nil), 200)
	r.body["address"] = "Back yard"
	r = e.want(e.do("PATCH", "/v1/sensors/S3", r.body), 200)
	if r.str("address") != "Back yard" {
		t.Fatalf("round trip: %s", r.raw)
	}

	// Subscriptions.
	r = e.want(e.do("PUT", "/v1/sensors/xa7v9Dfadr7H/clients/"+clID, nil), 200)
	subEtag := r.str("etag")
	if r.str("sensor_id") != "xa7v9Dfadr7H" || r.str("client_id") != clID || subEtag == "" {
		t.Fatalf("subscribe: %s", r.raw)
	}
	r = e.want(e.do("PUT", "/v1/sensors/xa7v9Dfadr7H/clients/"+clID, nil), 200)
	if r.str("etag") != subEtag {
		t.Fatalf("subscribing again made another subscription: %s", r.raw)
	}
	e.want(e.do("PUT", "/v1/sensors/S2/clients/"+clID, nil), 200)
	e.want(e.do("PUT", "/v1/sensors/Nope/clients/"+clID, nil), 404, "sensor")
	e.want(e.do("PUT", "/v1/sensors/S2/clients/cl_nosuchclient0000000", nil), 404, "client")
	e.want(e.do("PUT", "/v1/sensors/bad-id/clients/"+clID, nil), 400, "sensor_id")
	r = e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H/clients", nil), 200)
	if list, _ := r.body["clients"].([]any); len(list) != 1 || list[0].(map[string]any)["id"] != clID {
		t.Fatalf("sensor's clients: %s", r.raw)
	}
	r = e.want(e.do("GET", "/v1/clients/"+clID+"/sensors", nil), 200)
	if list, _ := r.body["sensors"].([]any); len(list) != 2 || list[1].(map[string]any)["state"] == nil {
		t.Fatalf("client's sensors: %s", r.raw)
	}
	e.want(e.do("GET", "/v1/sensors/Nope/clients", nil), 404)
	e.want(e.do("GET", "/v1/clients/cl_nosuchclient0000000/sensors", nil), 404)
	e.want(e.do("DELETE", "/v1/sensors/S2/clients/"+clID+"?etag=wrong", nil), 412)
	e.want(e.do("DELETE", "/v1/sensors/S2/clients/"+clID, nil, "If-Match", `"`+subEtag+`"`), 412) // another subscription's etag
	e.want(e.do("DELETE", "/v1/sensors/S2/clients/"+clID, nil), 200)
	e.want(e.do("DELETE", "/v1/sensors/S2/clients/"+clID, nil), 404, "subscription")

	// Deleting a sensor keeps its state; a stale etag is 412.
	r = e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H", nil), 200)
	e.want(e.do("DELETE", "/v1/sensors/xa7v9Dfadr7H?etag="+sEtag, nil), 412)
	e.want(e.do("DELETE", "/v1/sensors/xa7v9Dfadr7H?etag="+r.str("etag"), nil), 200)
	e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H", nil), 404)
	e.want(e.do("DELETE", "/v1/sensors/xa7v9Dfadr7H", nil), 404)
	e.want(e.do("GET", "/v1/sensors/xa7v9Dfadr7H/state", nil), 200)
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE sensor_id = 'xa7v9Dfadr7H'`); n != 0 {
		t.Fatalf("%d subscriptions of the deleted sensor remain", n)
	}
	// Registering it again shows its state at once.
	r = e.want(e.do("POST", "/v1/sensors", map[string]any{"id": "xa7v9Dfadr7H", "address": "Back again"}), 200)
	if r.body["state"] == nil || r.str("etag") == sEtag {
		t.Fatalf("re-registered sensor: %s", r.raw)
	}

	// Deleting a client removes its subscriptions.
	e.want(e.do("PUT", "/v1/sensors/S3/clients/"+clID, nil), 200)
	e.want(e.do("DELETE", "/v1/clients/"+clID, nil, "If-Match", `"`+etag1+`"`), 412)
	e.want(e.do("DELETE", "/v1/clients/"+clID+"?etag="+clEtag, nil), 200)
	e.want(e.do("GET", "/v1/clients/"+clID, nil), 404)
	if n := e.count(`SELECT count(*) FROM subscriptions WHERE client_id = $1`, clID); n != 0 {
		t.Fatalf("%d subscriptions of the deleted client remain", n)
	}

	// History calls are declared and say they are not served yet.
	for _, p := range []string{"/v1/sensors/S3/readings", "/v1/sensors/S3/events?start_time=2026-11-22T10:00:00Z", "/v1/clients/" + clID + "/deliveries"} {
		e.want(e.do("GET", p, nil), http.StatusNotImplemented, "not served")
	}
	e.want(e.do("GET", "/v1/sensors/S3/readings?start_time=yesterday", nil), 400, "start_time")
}

func TestRESTAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		name, auth string
		words      []string
	}{
		{"none", "", []string{"missing bearer token"}},
		{"wrong token", "Bearer not-the-token-0123456789", []string{"not one of LOCKS_API_TOKENS"}},
		{"prefix of the token", "Bearer " + testToken[:20], nil},
		{"basic", "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+testToken)), []string{"Bearer"}},
		{"no scheme", testToken, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, call := range [][2]string{{"GET", "/v1/clients"}, {"POST", "/v1/sensors"}, {"GET", "/v1/sensors/S1/state"}, {"DELETE", "/v1/clients/cl_x"}} {
				r := e.want(e.do(call[0], call[1], nil, "Authorization", c.auth), 401, c.words...)
				if r.header.Get("WWW-Authenticate") != `Bearer realm="lock-sensors"` {
					t.Fatalf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
				}
			}
		})
	}
	// Either configured token works, with any case of "bearer".
	e.want(e.do("GET", "/v1/clients", nil, "Authorization", "bearer second-token-0123456789"), 200)
	// The description and the health check need no token.
	r := e.do("GET", "/openapi.json", nil, "Authorization", "")
	if r.status != 200 || !strings.Contains(string(r.raw), `"swagger"`) || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("openapi.json: %d %.200s", r.status, r.raw)
	}
	if r := e.do("GET", "/healthz", nil, "Authorization", ""); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
}

func TestNoTokenConfigured(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withTokens())
	e.want(e.do("GET", "/v1/sensors", nil, "Authorization", "Bearer "+testToken), 401, "LOCKS_API_TOKENS")
	e.want(e.do("POST", "/v1/clients", map[string]any{"name": "x"}), 401, "LOCKS_API_TOKENS")
	_, err := e.sensors.ListSensors(t.Context(), &locksv1.ListSensorsRequest{})
	wantCode(t, err, codes.Unauthenticated, "LOCKS_API_TOKENS")
	if r := e.do("GET", "/openapi.json", nil); r.status != 200 {
		t.Fatalf("openapi.json %d", r.status)
	}
}

func TestRESTBodyLimitAndMethods(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	big := `{"id": "S1", "address": "` + strings.Repeat("a", 2<<20) + `"}`
	e.want(e.do("POST", "/v1/sensors", big), 400, "body: larger than")
	e.want(e.do("GET", "/v1/nothing-here", nil), 404, "no such path")
	e.want(e.do("POST", "/v1/sensors/S1/state", nil), 405, "not allowed")
}

// A rotation may shorten the old secret's overlap, to nothing for one that leaked; a second
// rotation with no overlap also ends the first one's.
func TestRotateSecretOverlap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.want(e.do("POST", "/v1/clients", map[string]any{"name": "Leaky", "webhook_url": "https://203.0.113.10/hook"}), 200)
	id := r.str("id")
	until := func(r resp) time.Duration {
		t.Helper()
		u, err := time.Parse(time.RFC3339Nano, r.str("previous_secret_until"))
		if err != nil {
			t.Fatalf("previous_secret_until %q: %v", r.str("previous_secret_until"), err)
		}
		return time.Until(u)
	}
	r = e.want(e.do("POST", "/v1/clients/"+id+":rotateSecret", map[string]any{"previous_secret_overlap": "3600s"}), 200)
	if d := until(r); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("an overlap of 1h ends in %v", d)
	}
	first := r.str("signing_secret")
	r = e.want(e.do("POST", "/v1/clients/"+id+":rotateSecret", map[string]any{"previous_secret_overlap": "0s"}), 200)
	if r.str("previous_secret") != "" || r.str("previous_secret_until") != "" || r.str("signing_secret") == first {
		t.Fatalf("a rotation with no overlap: %s; want a new secret and none still signing beside it", r.raw)
	}
	// Read back: the secret that signed until now no longer does.
	r = e.want(e.do("GET", "/v1/clients/"+id, nil), 200)
	if r.str("previous_secret") != "" || r.str("previous_secret_until") != "" {
		t.Fatalf("after a rotation with no overlap the old secret is still shown as signing: %s", r.raw)
	}
	for _, bad := range []string{"-1s", "169h"} {
		e.want(e.do("POST", "/v1/clients/"+id+":rotateSecret", map[string]any{"previous_secret_overlap": bad}), 400, "previous_secret_overlap")
	}
}
