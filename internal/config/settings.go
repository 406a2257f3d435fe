package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/chschema"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// setting is one variable: its name, default, and how to parse it into the Config.
type setting struct {
	env   string
	def   string
	usage string
	set   func(c *Config, v string) error
}

func settings() []setting {
	str := func(dst func(*Config) *string) func(*Config, string) error {
		return func(c *Config, v string) error { *dst(c) = v; return nil }
	}
	dur := func(dst func(*Config) *time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return errors.New("not a duration (use e.g. 90s, 5m, 1h)")
			}
			if d <= 0 {
				return errors.New("must be positive")
			}
			*dst(c) = d
			return nil
		}
	}
	urlOf := func(schemes ...string) func(dst func(*Config) *string) func(*Config, string) error {
		return func(dst func(*Config) *string) func(*Config, string) error {
			return func(c *Config, v string) error {
				u, err := url.Parse(v)
				if err != nil {
					// url's errors quote the piece they stumbled on, which in a URL with
					// user info is often part of the password (an unescaped "/" ends the
					// host early): say only where to look.
					if strings.Contains(v, "@") {
						return errors.New("not a URL; characters such as / ? # @ : in the user name or password must be percent-encoded")
					}
					return fmt.Errorf("not a URL: %v", errors.Unwrap(err))
				}
				ok := false
				for _, s := range schemes {
					ok = ok || u.Scheme == s
				}
				if !ok || u.Host == "" {
					return fmt.Errorf("must be a URL %s://host…", strings.Join(schemes, "|"))
				}
				*dst(c) = v
				return nil
			}
		}
	}
	boolean := func(dst func(*Config) *bool) func(*Config, string) error {
		return func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return errors.New("must be true or false")
			}
			*dst(c) = b
			return nil
		}
	}
	addr := func(dst func(*Config) *string) func(*Config, string) error {
		return func(c *Config, v string) error {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return errors.New("must be host:port")
			}
			*dst(c) = v
			return nil
		}
	}
	base := []setting{
		{"LOCKS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL (amqp:// or amqps://)", urlOf("amqp", "amqps")(func(c *Config) *string { return &c.AMQPURL })},
		{"LOCKS_AMQP_QUEUE", "sensor.readings", "queue the sensors publish to (invalid messages go to <queue>.invalid)", func(c *Config, v string) error {
			if v == "" {
				return errors.New("must not be empty")
			}
			c.AMQPQueue = v
			return nil
		}},
		{"LOCKS_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/locks?sslmode=disable", "PostgreSQL URL; pool_max_conns in it sizes the pool the process's parts share (default: LOCKS_PARTITIONS + 8, at least max(4, CPUs)); the webhook notifier keeps a pool of its own of max(4, CPUs) + 2, at most that size", urlOf("postgres", "postgresql")(func(c *Config) *string { return &c.PostgresURL })},
		{"LOCKS_CLICKHOUSE_URL", "clickhouse://127.0.0.1:9000/locks", "ClickHouse URL (native protocol)", urlOf("clickhouse", "tcp")(func(c *Config) *string { return &c.ClickHouseURL })},
		{"LOCKS_CLICKHOUSE_CLUSTER", "", "the ClickHouse cluster (a remote_servers name) whose nodes get replicated history tables with Distributed tables over them; empty: one ClickHouse node (docs/operations.md, Databases beyond one node)", func(c *Config, v string) error {
			if v != "" {
				if err := chschema.ValidName(v); err != nil {
					return err
				}
			}
			c.ClickHouseCluster = v
			return nil
		}},
		{"LOCKS_NATS_URL", "", "NATS URL, or a comma list of them; empty: run an embedded NATS server with JetStream", func(c *Config, v string) error {
			if v == "" {
				c.NATSURL = ""
				return nil
			}
			for _, part := range strings.Split(v, ",") {
				u, err := url.Parse(strings.TrimSpace(part))
				if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
					return errors.New("must be empty or nats://host:port[,nats://…]")
				}
			}
			c.NATSURL = v
			return nil
		}},
		{"LOCKS_NATS_LISTEN", "127.0.0.1:4222", "where the embedded NATS server listens, so that locks replay and the nats CLI can reach it (port 0: any free port)", addr(func(c *Config) *string { return &c.NATSListen })},
		{"LOCKS_NATS_SYNC", natsx.SyncDefault, "when the embedded NATS server fsyncs its store: always (every write) or an interval such as 2m (docs/operations.md, Durability)", func(c *Config, v string) error {
			s, err := natsx.ParseSync(v)
			c.NATSSync = s
			return err
		}},
		{"LOCKS_NATS_REPLICAS", "1", "replicas (1 to 5) of the streams and KV buckets a start creates (existing ones are raised, never lowered); above 1 needs LOCKS_NATS_URL pointing at a cluster (docs/operations.md, NATS versions and replicas)", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 5 {
				return errors.New("must be an integer from 1 to 5 (JetStream's limit)")
			}
			c.NATSReplicas = n
			return nil
		}},
		{"LOCKS_NATS_CREDS", "", "a .creds file (user JWT and nkey seed) for LOCKS_NATS_URL (docs/operations.md, NATS access control)", str(func(c *Config) *string { return &c.NATSAuth.Creds })},
		{"LOCKS_NATS_NKEY", "", "a file holding an nkey user seed for LOCKS_NATS_URL; empty with the embedded server: its own, LOCKS_DATA_DIR/nats-user.nk", str(func(c *Config) *string { return &c.NATSAuth.Nkey })},
		{"LOCKS_NATS_CA", "", "PEM file of the CAs of the NATS servers' certificates (TLS)", str(func(c *Config) *string { return &c.NATSAuth.CA })},
		{"LOCKS_NATS_CERT", "", "PEM client certificate for NATS (with LOCKS_NATS_KEY)", str(func(c *Config) *string { return &c.NATSAuth.Cert })},
		{"LOCKS_NATS_KEY", "", "PEM key of LOCKS_NATS_CERT", str(func(c *Config) *string { return &c.NATSAuth.Key })},
		{"LOCKS_NATS_DECLARE", "true", "create and update the streams and buckets at start; false only checks they exist (a part's NATS user may not declare)", boolean(func(c *Config) *bool { return &c.NATSDeclare })},
		{"LOCKS_CLOCK_SKEW_MAX", "5m", "a reading whose ts is further than this from its receive time is counted in locks_bridge_clock_skew_total (docs/contract.md, Sensor clocks)", dur(func(c *Config) *time.Duration { return &c.ClockSkewMax })},
		{"LOCKS_UNREGISTERED_MAX", "100000", "unregistered sensors tracked (state, liveness key); readings of further ones are recorded in READINGS but not tracked, counted in locks_unregistered_untracked_readings_total (docs/security.md, Unregistered sensors); 0: none", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 100_000_000 {
				return errors.New("must be an integer from 0 to 100000000")
			}
			c.UnregisteredMax = n
			return nil
		}},
		{"LOCKS_ACCEPT_UNREGISTERED", "true", "false: readings of sensors that are not registered go to the invalid queue (reason unregistered) instead of READINGS", boolean(func(c *Config) *bool { return &c.AcceptUnregistered })},
		{"LOCKS_DATA_DIR", "./.locks", "embedded NATS store and other local state (the kept API token of go tool task up)", str(func(c *Config) *string { return &c.DataDir })},
		{"LOCKS_HTTP_ADDR", "127.0.0.1:8080", "REST gateway, /openapi.json, /healthz, /readyz, /metrics and the dashboard at /ui/", addr(func(c *Config) *string { return &c.HTTPAddr })},
		{"LOCKS_GRPC_ADDR", "127.0.0.1:9090", "gRPC", addr(func(c *Config) *string { return &c.GRPCAddr })},
		{"LOCKS_API_TOKENS", "", "comma-separated administrator bearer tokens (16+ characters each); empty: the API refuses every call and says why at start-up", func(c *Config, v string) error {
			c.APITokens = nil
			ts := strings.Split(v, ",")
			for i, t := range ts {
				t = strings.TrimSpace(t)
				if t == "" {
					continue
				}
				if len(t) < 16 {
					return fmt.Errorf("token %d of %d has %d characters; each must have at least 16", i+1, len(ts), len(t))
				}
				c.APITokens = append(c.APITokens, t)
			}
			return nil
		}},
		{"LOCKS_LOST_AFTER", "1h", "silence after which a sensor is lost (a sensor's own lost_after overrides it)", dur(func(c *Config) *time.Duration { return &c.LostAfter })},
		{"LOCKS_RETRY_SCHEDULE", "10s,1m,5m,15m,30m,1h,2h,4h,8h", "comma-separated delays between webhook attempts (the default: 10 attempts over about 16 h, with 0-20% jitter added)", func(c *Config, v string) error {
			if v == "" {
				c.RetrySchedule = append([]time.Duration(nil), DefaultRetrySchedule...)
				return nil
			}
			var s []time.Duration
			for _, p := range strings.Split(v, ",") {
				d, err := time.ParseDuration(strings.TrimSpace(p))
				if err != nil || d <= 0 {
					return fmt.Errorf("%q is not a positive duration", p)
				}
				s = append(s, d)
			}
			c.RetrySchedule = s
			return nil
		}},
		{"LOCKS_WEBHOOK_TIMEOUT", "10s", "one webhook attempt's timeout", dur(func(c *Config) *time.Duration { return &c.WebhookTimeout })},
		{"LOCKS_WEBHOOK_LEASE_MARGIN", "30s", "how long a delivery's lease outlasts its attempt's timeout (at least 5s): no other process sends it before, so the outcome of an attempt has this long to be recorded; a notifier that dies mid-attempt leaves its deliveries to be sent again after LOCKS_WEBHOOK_TIMEOUT plus this (shorter: resent sooner after a crash; longer: a Postgres stall this long makes no duplicate send)", func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 5*time.Second {
				return errors.New("not a duration of at least 5s")
			}
			c.WebhookLeaseMargin = d
			return nil
		}},
		{"LOCKS_ENDPOINT_DISABLE_AFTER", "24h", "disable a client's endpoint whose attempts all failed (no 2xx at all) for this long; 0: never (docs/contract.md, Webhook controls)", func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return errors.New("not a duration (use e.g. 24h, or 0 for never)")
			}
			c.EndpointDisableAfter = d
			return nil
		}},
		{"LOCKS_METRICS_MAX_CLIENTS", "100", "clients with a client label of their own in the per-client webhook metrics; the others are summed under client=\"other\"", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100_000 {
				return errors.New("must be an integer from 1 to 100000")
			}
			c.MetricsMaxClients = n
			return nil
		}},
		{"LOCKS_WEBHOOK_ALLOW_PRIVATE", "false", "allow webhook URLs that resolve to loopback, private or other non-public addresses (the list: docs/contract.md, What is refused or hidden); true for a receiver on this machine", boolean(func(c *Config) *bool { return &c.WebhookAllowPrivate })},
		{"LOCKS_PARTITIONS", "16", "partitions of the READINGS log; fixed once the stream exists (a start with another count is refused); its flag is --partition-count", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1024 {
				return errors.New("must be an integer from 1 to 1024")
			}
			c.Partitions = n
			return nil
		}},
		{"LOCKS_LEASE_TTL", "6s", "life of a process's lease on a partition without renewal (1s to 1m): a dead process's partitions are taken over after it plus a third of it (docs/operations.md, Sharing partitions)", func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > time.Minute {
				return errors.New("must be a duration from 1s to 1m")
			}
			c.LeaseTTL = d
			return nil
		}},
		{"LOCKS_HISTORY_BATCH_SIZE", "10000", "rows per ClickHouse INSERT of the history projector", func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1_000_000 {
				return errors.New("must be an integer from 1 to 1000000")
			}
			c.HistoryBatchSize = n
			return nil
		}},
		{"LOCKS_HISTORY_FLUSH_INTERVAL", "1s", "age at which the history projector writes a batch that is not full", dur(func(c *Config) *time.Duration { return &c.HistoryFlushInterval })},
		{"LOCKS_STATE_SEEN_INTERVAL", "5s", "longest the state projector defers writing a sensor's last_seen_time and last_reading_time when nothing else of it changed (0 to 1m; 0 writes every reading); a change of state or connection is written at once, and the API states the bound with each state (docs/contract.md)", func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > time.Minute {
				return errors.New("must be a duration from 0s to 1m")
			}
			c.StateSeenInterval = d
			return nil
		}},
		{"LOCKS_WATCHDOG_SWEEP", "5m", "period of the watchdog's reconciliation sweep between the state projection and the liveness keys", dur(func(c *Config) *time.Duration { return &c.WatchdogSweep })},
		{"LOCKS_WATCHDOG_MAX_HOLD", "15m", "longest an expiry is held while the pipeline is behind; then the sensor is declared lost anyway", dur(func(c *Config) *time.Duration { return &c.WatchdogMaxHold })},
		{"LOCKS_UI_REFRESH", "3s", "how often the dashboard's panels reload (100ms to 5s); each panel is read once per period for all its viewers", func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 100*time.Millisecond || d > 5*time.Second {
				return errors.New("must be a duration from 100ms to 5s")
			}
			c.UIRefresh = d
			return nil
		}},
		{"LOCKS_PPROF", "false", "serve Go's profiler at /debug/pprof/ on LOCKS_HTTP_ADDR (no auth: keep that address private)", boolean(func(c *Config) *bool { return &c.Pprof })},
		{"LOCKS_LOG_LEVEL", "info", "debug, info, warn or error", func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "debug", "info", "warn", "error":
				c.LogLevel = strings.ToLower(v)
				return nil
			}
			return errors.New("must be debug, info, warn or error")
		}},
		{"LOCKS_LOG_FORMAT", "text", "text (logfmt-like key=value, for people) or json (one object a line with slog's standard keys time, level, msg, then the attributes, for log pipelines); the dashboard's LOGS panel reads the same JSON either way", func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "text", "json":
				c.LogFormat = strings.ToLower(v)
				return nil
			}
			return errors.New("must be text or json")
		}},
	}
	return append(append(base, alertSettings()...), retentionSettings()...)
}
