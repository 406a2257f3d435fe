package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// swagger is the part of an OpenAPI 2.0 document a simple client needs.
type swagger struct {
	Swagger             string                                     `json:"swagger"`
	BasePath            string                                     `json:"basePath"`
	Consumes            []string                                   `json:"consumes"`
	Paths               map[string]map[string]swaggerOp            `json:"paths"`
	Definitions         map[string]swaggerSchema                   `json:"definitions"`
	SecurityDefinitions map[string]struct{ Type, Name, In string } `json:"securityDefinitions"`
	Security            []map[string][]string                      `json:"security"`
}

type swaggerOp struct {
	OperationID string `json:"operationId"`
	Parameters  []struct {
		Name     string        `json:"name"`
		In       string        `json:"in"`
		Required bool          `json:"required"`
		Schema   swaggerSchema `json:"schema"`
	} `json:"parameters"`
	Responses map[string]struct {
		Schema swaggerSchema `json:"schema"`
	} `json:"responses"`
}

type swaggerSchema struct {
	Ref        string                   `json:"$ref"`
	Type       string                   `json:"type"`
	Properties map[string]swaggerSchema `json:"properties"`
	ReadOnly   bool                     `json:"readOnly"`
}

func (d *swagger) resolve(s swaggerSchema) swaggerSchema {
	if s.Ref != "" {
		return d.Definitions[strings.TrimPrefix(s.Ref, "#/definitions/")]
	}
	return s
}

// find returns the path and method of the operation with the given id.
func (d *swagger) find(t *testing.T, opID string) (string, string, swaggerOp) {
	t.Helper()
	for path, ops := range d.Paths {
		for method, op := range ops {
			if op.OperationID == opID {
				return path, strings.ToUpper(method), op
			}
		}
	}
	t.Fatalf("no operation %s in /openapi.json", opID)
	return "", "", swaggerOp{}
}

// conforms fails unless every field of v is a property of schema s, recursively.
func (d *swagger) conforms(t *testing.T, where string, v map[string]any, s swaggerSchema) {
	t.Helper()
	s = d.resolve(s)
	for k, x := range v {
		p, ok := s.Properties[k]
		if !ok {
			t.Fatalf("%s: field %q of the answer is not in the OpenAPI schema", where, k)
		}
		if m, ok := x.(map[string]any); ok && (p.Ref != "" || p.Properties != nil) {
			d.conforms(t, where+"."+k, m, p)
		}
	}
}

// A client that knows nothing but /openapi.json creates a sensor and reads its state: the
// path, method, body fields and auth header all come from the served document.
func TestOpenAPIClientCreatesSensor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res, err := http.Get(e.url + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var doc swagger
	if err := json.NewDecoder(res.Body).Decode(&doc); err != nil || res.StatusCode != 200 {
		t.Fatalf("GET /openapi.json: %d, %v", res.StatusCode, err)
	}
	if doc.Swagger != "2.0" {
		t.Fatalf("swagger %q", doc.Swagger)
	}

	// How to authenticate: the document's security definition.
	if len(doc.Security) == 0 {
		t.Fatal("the document requires no security")
	}
	var authHeader string
	for name := range doc.Security[0] {
		sd := doc.SecurityDefinitions[name]
		if sd.In != "header" {
			t.Fatalf("security %s is in %q", name, sd.In)
		}
		authHeader = sd.Name
	}

	call := func(method, path string, body any) (int, map[string]any) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(t.Context(), method, e.url+doc.BasePath+path, rd)
		req.Header.Set(authHeader, "Bearer "+testToken)
		if len(doc.Consumes) > 0 && rd != nil {
			req.Header.Set("Content-Type", doc.Consumes[0])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(res.Body).Decode(&out)
		return res.StatusCode, out
	}

	// Create a sensor: the body is the schema of the body parameter, filled by property name.
	path, method, op := doc.find(t, "SensorService_CreateSensor")
	body := map[string]any{}
	for _, p := range op.Parameters {
		if p.In != "body" {
			continue
		}
		props := doc.resolve(p.Schema).Properties
		for k, v := range map[string]any{"id": "FromDoc1", "address": "Documented st. 1"} {
			if _, ok := props[k]; !ok {
				t.Fatalf("the sensor schema has no %q: %v", k, props)
			}
			body[k] = v
		}
		if props["etag"].ReadOnly || !props["create_time"].ReadOnly || !props["state"].ReadOnly {
			t.Fatalf("read-only marks: etag %v, create_time %v, state %v", props["etag"].ReadOnly, props["create_time"].ReadOnly, props["state"].ReadOnly)
		}
	}
	if len(body) == 0 {
		t.Fatalf("%s %s has no body parameter", method, path)
	}
	status, got := call(method, path, body)
	if status != 200 || got["id"] != "FromDoc1" || got["address"] != "Documented st. 1" {
		t.Fatalf("%s %s: %d %v", method, path, status, got)
	}
	doc.conforms(t, "created sensor", got, op.Responses["200"].Schema)
	status, got = call(method, path, body)
	if status != 409 {
		t.Fatalf("again: %d %v", status, got)
	}
	doc.conforms(t, "error", got, op.Responses["default"].Schema)

	// Read its state, then the sensor list filtered by state, both from the document.
	e.setState("FromDoc1", 1, "lost", 4)
	path, method, op = doc.find(t, "StateService_GetSensorState")
	status, got = call(method, strings.Replace(path, "{sensor_id}", "FromDoc1", 1), nil)
	if status != 200 || got["connection"] != "CONNECTION_LOST" {
		t.Fatalf("%s %s: %d %v", method, path, status, got)
	}
	doc.conforms(t, "state", got, op.Responses["200"].Schema)
	path, method, op = doc.find(t, "SensorService_ListSensors")
	var query []string
	for _, p := range op.Parameters {
		switch p.Name {
		case "connection":
			query = append(query, "connection=CONNECTION_LOST")
		case "data":
			query = append(query, "data=1")
		}
	}
	if len(query) != 2 {
		t.Fatalf("ListSensors has no connection and data filters: %+v", op.Parameters)
	}
	status, got = call(method, path+"?"+strings.Join(query, "&"), nil)
	if list, _ := got["sensors"].([]any); status != 200 || len(list) != 1 {
		t.Fatalf("%s %s: %d %v", method, path, status, got)
	}
	doc.conforms(t, "sensor list", got, op.Responses["200"].Schema)
}

// Every operation of the document is routed by the gateway: none answers the router's own
// 404 ("no such path") or 405.
func TestOpenAPIPathsAreServed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var doc swagger
	if err := json.Unmarshal(e.do("GET", "/openapi.json", nil).raw, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for path, ops := range doc.Paths {
		for method := range ops {
			p := path
			for _, v := range []string{"{id}", "{sensor_id}", "{client_id}"} {
				p = strings.ReplaceAll(p, v, map[string]string{"{id}": "X1", "{sensor_id}": "X1", "{client_id}": "cl_x"}[v])
			}
			r := e.do(strings.ToUpper(method), p, nil)
			if r.status == 405 || strings.Contains(r.str("message"), "no such path") {
				t.Errorf("%s %s: %d %s: not routed", method, p, r.status, r.raw)
			}
			n++
		}
	}
	if n < 19 {
		t.Fatalf("%d operations in the document, want every call of docs/contract.md section 3 (19)", n)
	}
}
