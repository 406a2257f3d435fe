package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// maxBodyBytes bounds a REST request body; the largest valid one is a few KiB.
const maxBodyBytes = 1 << 20

// newGateway is the REST API: JSON with the proto field names (lower_snake_case), enums by
// name, zero values shown (data 0 is a state, not an absence), unknown fields refused, and
// errors as {code, message, details} with the HTTP status of httpStatus. Every request is
// authenticated (authn: Server.authenticate, the interceptor's check) before its body is read.
func newGateway(conn *grpc.ClientConn, authn func(ctx context.Context, authorization string) error) (http.Handler, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &fieldNamingJSON{runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}}),
		runtime.WithErrorHandler(errorHandler),
		runtime.WithRoutingErrorHandler(routingErrorHandler),
		runtime.WithForwardResponseOption(etagHeader),
		runtime.WithForwardResponseOption(watchOpened),
	)
	ctx := context.Background() // only kept by the handlers for cancellation; they have none
	for _, reg := range []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{
		locksv1.RegisterClientServiceHandler,
		locksv1.RegisterSensorServiceHandler,
		locksv1.RegisterSubscriptionServiceHandler,
		locksv1.RegisterStateServiceHandler,
		locksv1.RegisterHistoryServiceHandler,
		locksv1.RegisterProjectionServiceHandler,
		locksv1.RegisterSetAsideServiceHandler,
		locksv1.RegisterWebhookControlServiceHandler,
		locksv1.RegisterOverviewServiceHandler,
		locksv1.RegisterAlertServiceHandler,
		locksv1.RegisterClientTokenServiceHandler,
		locksv1.RegisterClientEventServiceHandler,
	} {
		if err := reg(ctx, mux, conn); err != nil {
			return nil, fmt.Errorf("api: register gateway handler: %w", err)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The gateway decodes the body before it calls the gRPC server, whose interceptor
		// authenticates: so without this, anyone could make the process read and parse up to
		// maxBodyBytes, and a malformed body got a 400 describing it instead of a 401.
		if err := authn(r.Context(), r.Header.Get("Authorization")); err != nil {
			_, out := runtime.MarshalerForRequest(mux, r)
			st, _ := statusOf(err)
			runtime.HTTPError(r.Context(), mux, out, w, r, st.Err())
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		}
		// Proto strings are UTF-8: anything else in the path or query would fail only when
		// the gateway marshals the gRPC request, as an internal error.
		if err := checkUTF8(r); err != nil {
			_, out := runtime.MarshalerForRequest(mux, r)
			st, _ := statusOf(err)
			runtime.HTTPError(r.Context(), mux, out, w, r, st.Err())
			return
		}
		mux.ServeHTTP(w, r)
	}), nil
}

func checkUTF8(r *http.Request) error {
	if !utf8.ValidString(r.URL.Path) {
		return fieldErr("path", "not valid UTF-8")
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fieldErr("query", "%v", err)
	}
	for k, vs := range q {
		if !utf8.ValidString(k) {
			return fieldErr("query", "a parameter name is not valid UTF-8")
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return fieldErr(k, "not valid UTF-8")
			}
		}
	}
	return nil
}

// errorHandler writes the gateway's error body with httpStatus's status (412 for a stale
// etag, which the gateway alone would make 400) and a proper WWW-Authenticate on 401.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var hs *runtime.HTTPStatusError
	if !errors.As(err, &hs) {
		st, _ := status.FromError(err)
		err = &runtime.HTTPStatusError{HTTPStatus: restStatus(st), Err: err}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, authHeaderWriter{w}, r, err)
}

// routingErrorHandler answers a path the API does not have with 404 and a method a path
// does not take with 405 (the gateway alone makes that 501), in the usual error body.
func routingErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	var err error
	switch httpStatus {
	case http.StatusNotFound:
		err = fmt.Errorf("%w: no such path: %s", ErrNotFound, r.URL.Path)
	case http.StatusMethodNotAllowed:
		err = fmt.Errorf("%w: method %s is not allowed on %s", ErrUnimplemented, r.Method, r.URL.Path)
	default:
		err = fmt.Errorf("%w: %s", ErrInvalid, http.StatusText(httpStatus))
	}
	st, _ := statusOf(err)
	errorHandler(ctx, mux, m, w, r, &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: st.Err()})
}

// authHeaderWriter replaces the gateway's WWW-Authenticate (the error message) with the
// challenge RFC 6750 asks for.
type authHeaderWriter struct{ http.ResponseWriter }

func (w authHeaderWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lock-sensors"`)
	}
	w.ResponseWriter.WriteHeader(code)
}

// watchOpened answers 200 as soon as an event watch is open (the server sends the header
// watchOpenHeader once the call is authorized and the client found), rather than with its
// first event, which may be a long time coming. A refused watch sends no header and gets the
// error's status.
func watchOpened(ctx context.Context, w http.ResponseWriter, resp proto.Message) error {
	if resp != nil {
		return nil
	}
	md, ok := runtime.ServerMetadataFromContext(ctx)
	if !ok || len(md.HeaderMD.Get(watchOpenHeader)) == 0 {
		return nil
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// etagHeader sets ETag on a REST answer that is one resource.
func etagHeader(_ context.Context, w http.ResponseWriter, resp proto.Message) error {
	var body any = resp
	if rb, ok := resp.(interface{ XXX_ResponseBody() any }); ok {
		body = rb.XXX_ResponseBody()
	}
	if e, ok := body.(interface{ GetEtag() string }); ok && e.GetEtag() != "" {
		w.Header().Set("ETag", `"`+e.GetEtag()+`"`)
	}
	return nil
}

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(locksv1.OpenAPI)
}

// fieldNamingJSON is the gateway's JSON marshaler, with errors that name the field of the
// body that could not be read (protojson only gives a line and column).
type fieldNamingJSON struct{ runtime.JSONPb }

// Marshal is JSONPb's, but for an event feed page, whose events are shown as the JSON
// objects they are (feedJSON).
func (m *fieldNamingJSON) Marshal(v any) ([]byte, error) {
	switch r := v.(type) {
	case *locksv1.ListClientEventsResponse:
		return feedJSON(r)
	case map[string]any: // a chunk of a stream: {"result": message}
		if it, ok := r["result"].(*locksv1.WatchClientEventsResponse); ok && len(r) == 1 {
			return watchJSON(it)
		}
	}
	return m.JSONPb.Marshal(v)
}

// StreamContentType is that of a stream's answer: newline-delimited JSON (the event watch).
func (m *fieldNamingJSON) StreamContentType(any) string { return "application/x-ndjson" }

// NewDecoder reads the whole body (bounded by maxBodyBytes) and decodes it at once.
func (m *fieldNamingJSON) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		data, err := io.ReadAll(r)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("body: larger than %d bytes", maxBodyBytes)
		}
		if err != nil {
			return fmt.Errorf("body: %w", err)
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return io.EOF // no body: the gateway treats it as an empty message
		}
		if err := m.JSONPb.Unmarshal(data, v); err != nil {
			return m.nameField(data, v, err)
		}
		return nil
	})
}

// nameField finds the top-level field whose value alone fails to decode and names it.
func (m *fieldNamingJSON) nameField(data []byte, v any, err error) error {
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return fmt.Errorf("body: %w", err)
	}
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer && !t.Implements(protoMessageType) {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Pointer {
		return fmt.Errorf("body: %w", err)
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		one, _ := json.Marshal(map[string]json.RawMessage{k: fields[k]})
		msg := reflect.New(t.Elem()).Interface()
		if ferr := m.JSONPb.Unmarshal(one, msg); ferr != nil {
			hint := ""
			if fd := msg.(proto.Message).ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(k)); fd != nil &&
				fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Duration" {
				hint = ` (a duration is written in seconds with an "s", like "3600s" or "1.5s")`
			}
			return fmt.Errorf("%s: %w%s", k, ferr, hint)
		}
	}
	return fmt.Errorf("body: %w", err)
}

var protoMessageType = reflect.TypeFor[proto.Message]()
