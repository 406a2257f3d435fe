// Package api serves the admin API of docs/contract.md section 3: gRPC services of package
// locks.v1 for clients, sensors, subscriptions, state and history, and the same calls as REST
// under /v1 through grpc-gateway, with /openapi.json describing them.
//
// REST requests are forwarded to the gRPC server over an in-process connection, so that one
// interceptor authenticates every call (bearer tokens of LOCKS_API_TOKENS), turns errors into
// gRPC codes (statusOf, the one place where codes are chosen) and counts it. Registry
// resources carry an etag for conditional updates and deletes; lists page with opaque keyset
// tokens. The registry and the current state are read from Postgres (the state projection is
// only read, never written, here); the history calls (readings, events, attempts, sensor
// statistics) are answered by the history store (ClickHouse) when one is given. A client's
// dead-lettered deliveries (ListClientDeliveries with state "dead") and their redrive are
// served by the notifier's dead-letter store (DeadLetters, in Postgres), without ClickHouse.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/test/bufconn"

	"github.com/lock-sensors/lock-sensors/internal/part"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Config is the API's part of the configuration.
type Config struct {
	// GRPCAddr is where Run serves gRPC (LOCKS_GRPC_ADDR).
	GRPCAddr string
	// Tokens are the accepted bearer tokens (LOCKS_API_TOKENS); none means every call is refused.
	Tokens []string
	// WebhookAllowPrivate allows webhook URLs on loopback and private addresses
	// (LOCKS_WEBHOOK_ALLOW_PRIVATE).
	WebhookAllowPrivate bool
	// WatchSendTimeout is how long a batch of an event watch may take to leave before the
	// watcher is cut off (0: WatchSendTimeoutDefault).
	WatchSendTimeout time.Duration
	// StateSeenInterval is the state projector's LOCKS_STATE_SEEN_INTERVAL, stated with
	// every sensor state as its last_seen_bound: how far last_seen_time may lag.
	StateSeenInterval time.Duration
}

// WatchSendTimeoutDefault is Config.WatchSendTimeout's default.
const WatchSendTimeoutDefault = 10 * time.Second

// Validate reports the first wrong field.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("api: GRPCAddr %q must be host:port", c.GRPCAddr)
	}
	if c.WatchSendTimeout < 0 {
		return errors.New("api: WatchSendTimeout must not be negative")
	}
	for _, t := range c.Tokens {
		if len(t) < 16 {
			return errors.New("api: every token must have at least 16 characters")
		}
	}
	return nil
}

// Deps are what the API is built from.
type Deps struct {
	// PG is Postgres with the registry and the state projection.
	PG DB
	// Logger gets the API's log lines.
	Logger *slog.Logger
	// Registerer gets the API's metrics.
	Registerer prometheus.Registerer
	// Resolver looks up webhook hosts; nil means net.DefaultResolver.
	Resolver Resolver
	// History answers the history calls (readings, events, deliveries); nil means they
	// answer UNIMPLEMENTED.
	History History
	// Projections lists the projections and runs the rebuilds started through the API
	// (ProjectionService); nil means those calls answer UNIMPLEMENTED.
	Projections Projections
	// JS is NATS, where the set-aside log messages are read (SetAsideService); nil means
	// that call answers UNIMPLEMENTED.
	JS jetstream.JetStream
	// DeadLetters lists and redrives dead-lettered deliveries (deliveries.go); nil means
	// those calls answer UNIMPLEMENTED.
	DeadLetters DeadLetters
	// Controls are the webhook controls (controls.go): enable, disable, resend, test event,
	// statistics, and the breaker reset a redrive also sends; nil means those calls answer
	// UNIMPLEMENTED (and a redrive resets no breaker).
	Controls Controls
	// Health is grpc.health.v1 (internal/health), served without a token like /readyz;
	// nil means none.
	Health healthpb.HealthServer
}

// Server is the admin API.
type Server struct {
	cfg      Config
	db       DB
	log      *slog.Logger
	resolver Resolver
	history  History
	auth     *authenticator
	touches  tokenTouches // when client tokens' last use was last written (tokens.go)
	hub      *feedHub     // reads new feed rows for event watchers (feedhub.go)
	metrics  *metrics

	grpc    *grpc.Server
	mem     *bufconn.Listener // the gateway's in-process connection to grpc
	conn    *grpc.ClientConn
	handler http.Handler

	serveOnce sync.Once

	projections Projections         // runs ProjectionService's rebuilds (projections.go)
	js          jetstream.JetStream // SET_ASIDE is read from it (setaside.go)
	deadLetters DeadLetters         // dead-lettered deliveries (deliveries.go)
	controls    Controls            // webhook controls (controls.go)
}

// New builds the API; nothing is listened on until Run (or Serve).
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := part.Require("api", part.Dep{Name: "PG", Value: deps.PG}, part.Dep{Name: "Logger", Value: deps.Logger},
		part.Dep{Name: "Registerer", Value: deps.Registerer}); err != nil {
		return nil, err
	}
	m, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, db: deps.PG, log: deps.Logger, resolver: deps.Resolver, history: deps.History, projections: deps.Projections, js: deps.JS,
		auth: newAuthenticator(cfg.Tokens), metrics: m,
		mem: bufconn.Listen(1 << 20),
	}
	s.deadLetters = deps.DeadLetters
	s.hub = newFeedHub(deps.PG, deps.Logger)
	s.controls = deps.Controls
	if s.resolver == nil {
		s.resolver = net.DefaultResolver
	}
	s.grpc = grpc.NewServer(
		// The token is checked on the call's headers, before its message is read and
		// decoded; the interceptors check it again for what the tap does not see.
		grpc.InTapHandle(s.tap),
		grpc.ChainUnaryInterceptor(s.unary),
		grpc.ChainStreamInterceptor(s.stream),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.ConnectionTimeout(ConnectionTimeout),
		grpc.KeepaliveEnforcementPolicy(KeepaliveEnforcement),
		grpc.KeepaliveParams(KeepaliveParams),
	)
	locksv1.RegisterClientServiceServer(s.grpc, &clientService{s: s})
	locksv1.RegisterSensorServiceServer(s.grpc, &sensorService{s: s})
	locksv1.RegisterSubscriptionServiceServer(s.grpc, &subscriptionService{s: s})
	locksv1.RegisterStateServiceServer(s.grpc, &stateService{s: s})
	locksv1.RegisterHistoryServiceServer(s.grpc, &historyService{s: s})
	locksv1.RegisterProjectionServiceServer(s.grpc, &projectionService{s: s})
	locksv1.RegisterSetAsideServiceServer(s.grpc, &setAsideService{s: s})
	locksv1.RegisterWebhookControlServiceServer(s.grpc, &controlService{s: s})
	locksv1.RegisterOverviewServiceServer(s.grpc, &overviewService{s: s})
	locksv1.RegisterAlertServiceServer(s.grpc, &alertService{s: s})
	locksv1.RegisterClientTokenServiceServer(s.grpc, &tokenService{s: s})
	locksv1.RegisterClientEventServiceServer(s.grpc, &feedService{s: s})
	if deps.Health != nil {
		healthpb.RegisterHealthServer(s.grpc, deps.Health)
	}
	// Server reflection lets grpcurl and the like discover the services (with a token: the
	// stream interceptor guards it like every call).
	reflection.Register(s.grpc)

	s.conn, err = grpc.NewClient("passthrough:///locks-api-in-process",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.mem.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		return nil, fmt.Errorf("api: in-process gRPC connection: %w", err)
	}
	gw, err := newGateway(s.conn, func(ctx context.Context, authorization string) error {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		_, err := s.authenticate(ctx, authorization)
		return err
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", gw)
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	s.handler = mux
	return s, nil
}

// Handler serves the REST API under /v1/ and its description at GET /openapi.json. Mount it
// on both patterns; it answers once Run (or Serve) is serving.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves gRPC on Config.GRPCAddr until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("LOCKS_GRPC_ADDR=%s: %w", s.cfg.GRPCAddr, err)
	}
	return s.Serve(ctx, ln)
}

// shutdownGrace bounds how long calls under way get to finish at shutdown.
const shutdownGrace = 5 * time.Second

// Serve serves gRPC on ln (and the gateway's in-process connection) until ctx is done, then
// lets calls under way finish for a bounded time. It may be called once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	first := false
	s.serveOnce.Do(func() { first = true })
	if !first {
		_ = ln.Close()
		return errors.New("api: Serve called twice")
	}
	if len(s.cfg.Tokens) == 0 {
		s.log.Warn("no API token configured: every API call will be refused; set LOCKS_API_TOKENS to a comma-separated list of bearer tokens")
	}
	hubCtx, stopHub := context.WithCancel(ctx)
	defer stopHub()
	go s.hub.run(hubCtx)
	errc := make(chan error, 2)
	go func() { errc <- s.grpc.Serve(s.mem) }()
	go func() { errc <- s.grpc.Serve(ln) }()
	s.log.Info("gRPC listening", "addr", ln.Addr().String(), "tokens", len(s.cfg.Tokens))
	var err error
	select {
	case err = <-errc:
		err = fmt.Errorf("gRPC server: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(shutdownGrace):
		s.grpc.Stop()
		<-stopped
	}
	_ = s.conn.Close()
	return err
}

func (s *Server) checkWebhookURL(ctx context.Context, raw string) error {
	return checkWebhookURL(ctx, raw, s.cfg.WebhookAllowPrivate, s.resolver)
}

// Authorized reports whether r carries one of the API's bearer tokens; /readyz shows its
// checks' error text only to such requests.
func (s *Server) Authorized(r *http.Request) bool {
	return s.auth.check(r.Header.Get("Authorization")) == nil
}
