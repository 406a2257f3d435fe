// Package config holds the process configuration of docs/contract.md section 4: environment
// variables named LOCKS_*, each overridable by a kebab-case flag, validated before anything
// starts so that a bad value is reported as one line naming the variable.
package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// Config is the whole process configuration. Parts take the fields they need.
type Config struct {
	AMQPURL             string
	AMQPQueue           string
	PostgresURL         string
	ClickHouseURL       string
	NATSURL             string
	NATSListen          string
	DataDir             string
	HTTPAddr            string
	GRPCAddr            string
	APITokens           []string
	LostAfter           time.Duration
	RetrySchedule       []time.Duration
	WebhookTimeout      time.Duration
	WebhookAllowPrivate bool
	Partitions          int
	LogLevel            string
	// LogFormat is "text" or "json" (internal/logfmt).
	LogFormat string
	// Retention: how long streams, the notifier's rows and ClickHouse history are kept.
	Retention
	// HistoryBatchSize and HistoryFlushInterval bound the history projector's batches.
	HistoryBatchSize     int
	HistoryFlushInterval time.Duration
	// StateSeenInterval is how long the state projector may defer writing a sensor's
	// liveness when nothing else of it changed; 0: every reading is written.
	StateSeenInterval time.Duration
	// UIRefresh is how often the dashboard's panels reload.
	UIRefresh time.Duration
	// WatchdogSweep is the period of the watchdog's reconciliation sweep.
	WatchdogSweep time.Duration
	// WatchdogMaxHold bounds how long the watchdog holds an expiry while the pipeline is behind.
	WatchdogMaxHold time.Duration
	// Pprof serves net/http/pprof on the ops server.
	Pprof bool
	// NATSSync is when the embedded NATS server syncs its store to disk.
	NATSSync natsx.Sync
	// NATSReplicas is how many NATS servers keep each stream and bucket the process creates.
	NATSReplicas int
	// NATSAuth names the credential and TLS files for LOCKS_NATS_URL (deploy/nats/accounts.conf).
	NATSAuth natsx.Auth
	// NATSDeclare: create and update the streams and buckets at start; a part whose NATS user
	// may not (deploy/nats/accounts.conf gives that only to admin) only checks them.
	NATSDeclare bool
	// ClockSkewMax is how far a reading's ts may be from its receive time before the bridge
	// counts it in locks_bridge_clock_skew_total.
	ClockSkewMax time.Duration
	// UnregisteredMax is how many unregistered sensors are tracked (state, liveness key);
	// readings of others are recorded, marked untracked (docs/security.md).
	UnregisteredMax int
	// AcceptUnregistered false: the bridge moves readings of unregistered sensors to the
	// invalid queue.
	AcceptUnregistered bool
	// LeaseTTL is how long a process's claim on a partition lives without renewal: its
	// partitions are taken over this long (plus a renewal period) after it dies.
	LeaseTTL time.Duration
	// ClickHouseCluster names the ClickHouse cluster the history tables span; empty: one node.
	ClickHouseCluster string
	// WebhookLeaseMargin is how long a delivery's lease outlasts its attempt's timeout.
	WebhookLeaseMargin time.Duration
	// EndpointDisableAfter disables a webhook endpoint failing without a 2xx this long; 0 never.
	EndpointDisableAfter time.Duration
	// MetricsMaxClients bounds the client label of the notifier's per-client metrics.
	MetricsMaxClients int
	// Alerts configures the alerter (alerts.go).
	Alerts Alerts
}

// DefaultRetrySchedule is the delay before attempt 2, 3, … of a webhook: ten attempts over
// about a day, growing roughly geometrically (jitter is added by the notifier).
var DefaultRetrySchedule = []time.Duration{
	10 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour,
}

// Error names the variable whose value is wrong.
type Error struct {
	Var    string
	Value  string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Reason)
}

// ErrUsage marks a configuration problem; the binary exits with status 2 on it.
var ErrUsage = errors.New("bad configuration")

func (e *Error) Unwrap() error { return ErrUsage }

// Default is the configuration with every default and nothing from the environment.
func Default() Config {
	c, err := Load(func(string) string { return "" }, nil, nil)
	if err != nil {
		panic(err) // the defaults are constants; a failure here is a programming error
	}
	return c
}
