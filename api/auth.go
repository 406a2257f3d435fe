package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

// errNoTokens is what every call gets when no token is configured.
var errNoTokens = fmt.Errorf("%w: this server has no API token configured, so it refuses every call; set LOCKS_API_TOKENS to a comma-separated list of bearer tokens (16 characters or more each) and restart", ErrUnauthenticated)

// authenticator checks administrator bearer tokens (client tokens: tokens.go). Tokens are kept as SHA-256 digests and compared in
// constant time, all of them every time, so neither a token's length nor which token
// matched shows in the timing.
type authenticator struct {
	digests [][sha256.Size]byte
}

func newAuthenticator(tokens []string) *authenticator {
	a := &authenticator{}
	for _, t := range tokens {
		a.digests = append(a.digests, sha256.Sum256([]byte(t)))
	}
	return a
}

// check authenticates the authorization value of a call ("" when absent).
func (a *authenticator) check(authorization string) error {
	if len(a.digests) == 0 {
		return errNoTokens
	}
	if authorization == "" {
		return fmt.Errorf("%w: missing bearer token; send the header Authorization: Bearer <token> (gRPC metadata authorization)", ErrUnauthenticated)
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return fmt.Errorf("%w: the authorization must be \"Bearer <token>\"", ErrUnauthenticated)
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	match := 0
	for i := range a.digests {
		match |= subtle.ConstantTimeCompare(got[:], a.digests[i][:])
	}
	if match != 1 {
		return fmt.Errorf("%w: the bearer token is not one of LOCKS_API_TOKENS", ErrUnauthenticated)
	}
	return nil
}

func authorizationOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// metrics of the API, by gRPC method (REST calls are counted under the method they map to).
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_api_requests_total",
			Help: "Admin API calls (gRPC, and REST through the gateway), by method and gRPC code.",
		}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "locks_api_request_duration_seconds",
			Help:    "Time to serve an admin API call, by method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"method"}),
	}
	if err := part.Register(reg, "api", m.requests, m.duration); err != nil {
		return nil, err
	}
	return m, nil
}

// callTimeout bounds one call, so that a stuck database cannot pile calls up for ever.
const callTimeout = 30 * time.Second

// unary authenticates and authorizes (authz.go), recovers panics, maps errors to codes (statusOf) and records metrics:
// every call goes through it, REST ones included, since the gateway calls over gRPC.
func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	defer func() {
		s.metrics.requests.WithLabelValues(method, codeOf(err)).Inc()
		s.metrics.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	}()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	// grpc.health.v1 needs no token: probes carry none, and it says no more than /readyz.
	if !isHealth(info.FullMethod) {
		p, err := s.authenticate(ctx, authorizationOf(ctx))
		if err != nil {
			return nil, s.toStatus(ctx, info.FullMethod, err)
		}
		if err := s.authorize(ctx, p, info.FullMethod, req); err != nil {
			return nil, s.toStatus(ctx, info.FullMethod, err)
		}
	}
	resp, err = s.call(ctx, req, handler)
	if err != nil {
		return nil, s.toStatus(ctx, info.FullMethod, err)
	}
	return resp, nil
}

// call runs the handler, turning a panic into an internal error so that no input can take
// the process down.
func (s *Server) call(ctx context.Context, req any, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return handler(ctx, req)
}

func (s *Server) toStatus(ctx context.Context, method string, err error) error {
	st, internal := statusOf(err)
	if internal {
		s.log.ErrorContext(ctx, "API call failed", "method", method, "err", err)
	} else {
		s.log.DebugContext(ctx, "API call refused", "method", method, "code", st.Code().String(), "message", st.Message())
	}
	return st.Err()
}

// The gRPC port's limits (docs/security.md).
const (
	// MaxRecvMsgSize is the largest request message: the largest REST body is 1 MiB too.
	MaxRecvMsgSize = 1 << 20
	// MaxConcurrentStreams bounds the calls one connection has open at once (gRPC's
	// default is unbounded); WatchClientEvents streams count too.
	MaxConcurrentStreams = 100
	// MaxHeaderListSize bounds a call's metadata (the token is a few dozen bytes).
	MaxHeaderListSize = 16 << 10
	// ConnectionTimeout bounds a new connection's handshake.
	ConnectionTimeout = 10 * time.Second
)

// KeepaliveEnforcement closes (GOAWAY "too_many_pings") a connection that pings more than
// every 20 s, or pings with no call open: pings cost the server and keep idle connections.
var KeepaliveEnforcement = keepalive.EnforcementPolicy{MinTime: 20 * time.Second, PermitWithoutStream: false}

// KeepaliveParams close idle connections after 5 minutes and probe a silent peer each
// minute, dropping it after 20 s without an answer.
var KeepaliveParams = keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second}

// tap refuses a call without a valid token from its headers alone, before gRPC reads its
// message: an anonymous client cannot make the server buffer and decode up to
// MaxRecvMsgSize per call. A client token is only checked for its form here (the tap runs
// on the connection's reader, which a database look-up would hold); the interceptor looks
// it up before the handler runs.
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if isHealth(info.FullMethodName) {
		return ctx, nil
	}
	var authorization string
	if v := info.Header.Get("authorization"); len(v) > 0 {
		authorization = v[0]
	}
	if token, err := bearer(authorization); err == nil && wellFormedClientToken(token) {
		return ctx, nil
	}
	if err := s.auth.check(authorization); err != nil {
		method := info.FullMethodName[strings.LastIndexByte(info.FullMethodName, '/')+1:]
		s.metrics.requests.WithLabelValues(method, codes.Unauthenticated.String()).Inc()
		return nil, s.toStatus(ctx, info.FullMethodName, err)
	}
	return ctx, nil
}

// stream guards streaming calls the same way: authentication at once, authorization of a
// server stream's request when the handler reads it (authorizedStream), errors mapped by
// statusOf. Streams without a row in permissions (reflection) are for administrators.
func (s *Server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if isHealth(info.FullMethod) {
		return s.streamStatus(ss.Context(), info.FullMethod, handler(srv, ss))
	}
	p, err := s.authenticate(ss.Context(), authorizationOf(ss.Context()))
	if err != nil {
		return s.toStatus(ss.Context(), info.FullMethod, err)
	}
	if p.admin {
		return s.streamStatus(ss.Context(), info.FullMethod, handler(srv, ss))
	}
	if _, ok := permissionOf[info.FullMethod]; !ok || !info.IsServerStream || info.IsClientStream {
		// Reflection and the like: for administrators (decide says why).
		if err := s.authorize(ss.Context(), p, info.FullMethod, nil); err != nil {
			return s.toStatus(ss.Context(), info.FullMethod, err)
		}
	}
	// A server stream's one request is read by the handler: authorized as it arrives.
	return s.streamStatus(ss.Context(), info.FullMethod, handler(srv, &authorizedStream{ServerStream: ss, check: func(req any) error {
		return s.authorize(ss.Context(), p, info.FullMethod, req)
	}}))
}

// streamStatus maps a stream handler's error to its code, as unary does.
func (s *Server) streamStatus(ctx context.Context, method string, err error) error {
	if err == nil {
		return nil
	}
	return s.toStatus(ctx, method, err)
}

// authorizedStream authorizes the request of a server-streaming call when the handler reads it.
type authorizedStream struct {
	grpc.ServerStream
	check func(req any) error
}

func (a *authorizedStream) RecvMsg(m any) error {
	if err := a.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return a.check(m)
}

// isHealth says whether fullMethod is grpc.health.v1's, which needs no token.
func isHealth(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
}

func codeOf(err error) string {
	if err == nil {
		return "OK"
	}
	st, _ := statusOf(err)
	return st.Code().String()
}
