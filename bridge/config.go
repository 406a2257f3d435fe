package bridge

import (
	"errors"
	"time"
)

// Defaults of Config's zero fields.
const (
	// PrefetchDefault: 3000 was no faster on the 2-core test machine and doubled the append latency.
	PrefetchDefault         = 1000
	ConnectionNameDefault   = "locks-bridge"
	ReconnectMinDefault     = 250 * time.Millisecond
	ReconnectMaxDefault     = 10 * time.Second
	PublishTimeoutDefault   = 5 * time.Second
	DrainTimeoutDefault     = 10 * time.Second
	InvalidMaxLengthDefault = 100_000
	StandbyPollDefault      = 2 * time.Second
	UnregisteredMaxDefault  = 100_000
	RegistryRefreshDefault  = time.Minute
	LookupsPerSecondDefault = 50
)

// Config is what the bridge is told; zero fields take the defaults.
type Config struct {
	AMQPURL string
	// Queue is the readings queue (declared durable if missing).
	Queue string
	// InvalidQueue defaults to Queue + ".invalid".
	InvalidQueue string
	// Prefetch is the AMQP QoS: how many unacked messages RabbitMQ sends ahead (PrefetchDefault).
	Prefetch int
	// MaxInFlight bounds the appends awaiting JetStream's ack (default Prefetch).
	MaxInFlight int
	// ConnectionName is the AMQP connection_name client property (ConnectionNameDefault)
	// of the consuming connection, shown by `rabbitmqctl list_connections client_properties`;
	// the connection publishing to the invalid queue is named ConnectionName + "-invalid".
	ConnectionName string
	// ReconnectMin and ReconnectMax bound the backoff between RabbitMQ sessions
	// (ReconnectMinDefault, ReconnectMaxDefault).
	ReconnectMin, ReconnectMax time.Duration
	// StandbyPoll is how often a standby bridge tries to become the queue's consumer
	// (StandbyPollDefault): the queue has one consumer at a time (see session.go).
	StandbyPoll time.Duration
	// PublishTimeout is how long an append waits for JetStream's ack before it is retried
	// (PublishTimeoutDefault); a retry carries the same Nats-Msg-Id, so it is never recorded
	// twice.
	PublishTimeout time.Duration
	// DrainTimeout bounds how long a stopping bridge waits for the appends in flight so
	// that it can ack them (DrainTimeoutDefault); what it cannot ack is redelivered and
	// de-duplicated.
	DrainTimeout time.Duration
	// InvalidMaxLength caps the invalid queue when the bridge declares it
	// (InvalidMaxLengthDefault messages, the oldest dropped first), so a flood of bad messages
	// cannot fill RabbitMQ's disk. A queue that already exists keeps its own arguments and policies.
	InvalidMaxLength int
	// ClockSkewMax is how far a reading's ts may be from its receive time before it is counted
	// in locks_bridge_clock_skew_total (default ClockSkewMaxDefault; see clock.go).
	ClockSkewMax time.Duration
	// UnregisteredMax is LOCKS_UNREGISTERED_MAX, the most unregistered sensors tracked
	// (UnregisteredMaxDefault; negative: none); readings of others are appended marked
	// untracked (unregistered.go).
	UnregisteredMax int
	// RefuseUnregistered is LOCKS_ACCEPT_UNREGISTERED=false: a reading of a sensor that is
	// not registered goes to the invalid queue (reason ReasonUnregistered).
	RefuseUnregistered bool
	// RegistryRefresh is how often the registry is read again, and the untracked and refused
	// readings are logged (RegistryRefreshDefault).
	RegistryRefresh time.Duration
	// LookupsPerSecond bounds the registry lookups of sensors not known to be registered
	// (LookupsPerSecondDefault).
	LookupsPerSecond int
}

func (c *Config) setDefaults() {
	if c.InvalidQueue == "" && c.Queue != "" {
		c.InvalidQueue = c.Queue + ".invalid"
	}
	if c.Prefetch <= 0 {
		c.Prefetch = PrefetchDefault
	}
	if c.MaxInFlight <= 0 || c.MaxInFlight > c.Prefetch {
		c.MaxInFlight = c.Prefetch
	}
	if c.ConnectionName == "" {
		c.ConnectionName = ConnectionNameDefault
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = ReconnectMinDefault
	}
	if c.StandbyPoll <= 0 {
		c.StandbyPoll = StandbyPollDefault
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = max(ReconnectMaxDefault, c.ReconnectMin)
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = PublishTimeoutDefault
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DrainTimeoutDefault
	}
	if c.InvalidMaxLength <= 0 {
		c.InvalidMaxLength = InvalidMaxLengthDefault
	}
	if c.ClockSkewMax <= 0 {
		c.ClockSkewMax = ClockSkewMaxDefault
	}
	if c.UnregisteredMax == 0 {
		c.UnregisteredMax = UnregisteredMaxDefault
	}
	if c.RegistryRefresh <= 0 {
		c.RegistryRefresh = RegistryRefreshDefault
	}
	if c.LookupsPerSecond <= 0 {
		c.LookupsPerSecond = LookupsPerSecondDefault
	}
}

// Validate says what is wrong with a configuration (after defaults).
func (c Config) Validate() error {
	switch {
	case c.AMQPURL == "":
		return errors.New("bridge: AMQP URL is empty")
	case c.Queue == "":
		return errors.New("bridge: queue name is empty")
	case c.InvalidQueue == c.Queue:
		return errors.New("bridge: the invalid queue must differ from the readings queue")
	}
	return nil
}
