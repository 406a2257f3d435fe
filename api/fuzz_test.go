package api

import (
	"strings"
	"testing"
)

// FuzzRESTBodies sends any body to the create and update calls over REST: the answer is a
// success or a 4xx with the error body, never a 5xx (no input crashes or confuses the API).
func FuzzRESTBodies(f *testing.F) {
	e := newEnv(f, withStderrLog(), withPrivateWebhooks())
	e.with(f).want(e.with(f).do("POST", "/v1/sensors", map[string]any{"id": "Fz1", "address": "x"}), 200)
	cl := e.with(f).want(e.with(f).do("POST", "/v1/clients", map[string]any{"name": "c", "webhook_url": "http://127.0.0.1:1/"}), 200).str("id")
	for _, s := range []string{
		`{"id": "A1", "address": "x"}`, `{"id": "A1", "address": "x", "lost_after": "90s"}`,
		`{"lost_after": null}`, `{"lost_after": "1.5s"}`, `{"lost_after": "-1s"}`, `{"lost_after": 5}`,
		`{"state": {"data": 1}}`, `{"etag": 7}`, `{"id": ["a"]}`, `{"address": "\u0000"}`,
		`{"name": "n", "webhook_url": "http://[::1]:80/"}`, `{"webhook_url": "http://%zz/"}`,
		`{}`, `[]`, `null`, `"x"`, `{"a":`, `{"id": "A1"} {"id": "A2"}`, "\xff\xfe", `{"create_time": "yesterday"}`,
		`{"update_time": "2026-13-40T00:00:00Z"}`, `{"id": "A1", "address": "` + strings.Repeat("é", 600) + `"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		e := e.with(t)
		for _, c := range [][2]string{
			{"POST", "/v1/sensors"}, {"PATCH", "/v1/sensors/Fz1"},
			{"POST", "/v1/clients"}, {"PATCH", "/v1/clients/" + cl}, {"POST", "/v1/clients/" + cl + ":rotateSecret"},
		} {
			r := e.do(c[0], c[1], body)
			if r.status >= 500 || r.status < 200 {
				t.Fatalf("%s %s with %q: %d %s", c[0], c[1], body, r.status, r.raw)
			}
			if r.status >= 400 {
				if _, ok := r.body["message"].(string); !ok {
					t.Fatalf("%s %s with %q: %d without an error body: %s", c[0], c[1], body, r.status, r.raw)
				}
			}
		}
	})
}
