// Package natsx runs the embedded NATS server, connects to NATS, and declares the streams
// and buckets every part relies on. Declaration is idempotent; a stream whose existing
// configuration cannot be changed in place (its partition count, its subjects) makes the
// process refuse to start instead of silently reshuffling sensors between partitions.
package natsx

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// Names of the streams, subjects and bucket. Subjects carry the partition so that a
// consumer per partition is a filter, and a sensor's messages stay in one partition.
const (
	ReadingsStream = "READINGS"
	// ReadingsIn is where publishers append a sensor's message: readings.in.<sensor_id>.
	// The stream stores it as readings.<partition>.<sensor_id>.
	ReadingsIn     = "readings.in."
	EventsStream   = "EVENTS"
	LivenessBucket = "liveness"
	// BridgeSessionsBucket holds, per bridge session (one AMQP channel), the last delivery tag
	// it is about to ack, so that a later session can tell which of its redelivered messages
	// were already appended (see bridge/identity.go).
	BridgeSessionsBucket = "bridge_sessions"
	// BridgeSessionsTTL is how long a session's record is kept: a message RabbitMQ redelivers
	// later than this after its session died is appended again if it had been appended.
	BridgeSessionsTTL = 7 * 24 * time.Hour
	// DeliveriesStream records every webhook attempt: deliveries.<client_id>.
	DeliveriesStream = "DELIVERIES"
)

// DeliveriesSubject is where the notifier records an attempt for a client.
func DeliveriesSubject(clientID string) string { return "deliveries." + clientID }

// ReadingsSubject is the subject a publisher appends a sensor's message to.
func ReadingsSubject(sensorID string) string { return ReadingsIn + sensorID }

// ReadingsStoredSubject is where READINGS stores a sensor's messages, in its partition p.
func ReadingsStoredSubject(p int, sensorID string) string {
	return "readings." + strconv.Itoa(p) + "." + sensorID
}

// ReadingsStoredPartition is the partition of a subject ReadingsStoredSubject made, when
// subject is one.
func ReadingsStoredPartition(subject string) (int, bool) {
	rest, ok := strings.CutPrefix(subject, "readings.")
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(p)
	return n, err == nil && n >= 0
}

// LivenessKeySubject is the subject of a key (or, with a wildcard, of keys) in the
// liveness bucket, as the bucket's stream stores it.
func LivenessKeySubject(key string) string { return "$KV." + LivenessBucket + "." + key }

// ReadingsPartitionFilter is the stored subjects of one partition.
func ReadingsPartitionFilter(p int) string { return "readings." + strconv.Itoa(p) + ".*" }

// EventsSubject is where the event of a sensor in partition p is published.
func EventsSubject(p int, sensorID string) string {
	return "events." + strconv.Itoa(p) + "." + sensorID
}

// EventsPartitionFilter is the subjects of one partition of EVENTS.
func EventsPartitionFilter(p int) string { return "events." + strconv.Itoa(p) + ".*" }

// ReadingsSensorFilter is the stored subject of one sensor's READINGS messages, whatever
// its partition.
func ReadingsSensorFilter(sensorID string) string { return "readings.*." + sensorID }

// Sync is when the embedded JetStream store calls fsync: after every write (Always), or in
// the background every Interval. Between two syncs an append JetStream has acknowledged is
// only in the page cache, so a power loss (not a process crash) can lose it, as Jepsen's
// analysis of NATS 2.12 showed; the bridge has acked RabbitMQ by then, so nothing resends it.
type Sync struct {
	Always   bool
	Interval time.Duration
}

// SyncDefault is LOCKS_NATS_SYNC's default; docs/operations.md, "Durability", gives the figures behind it.
const SyncDefault = "always"

// ParseSync reads "always" or a duration such as "2m" (at least 1ms).
func ParseSync(v string) (Sync, error) {
	if strings.EqualFold(strings.TrimSpace(v), "always") {
		return Sync{Always: true}, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d < time.Millisecond {
		return Sync{}, errors.New(`must be "always" or a duration of at least 1ms such as "2m"`)
	}
	return Sync{Interval: d}, nil
}

func (s Sync) String() string {
	if s.Always {
		return "always"
	}
	return s.Interval.String()
}

// Embedded runs a NATS server with JetStream in this process, storing under dir and
// listening on listen (host:port; port 0 picks a free port), syncing its store as sync says.
// It admits only the user of EmbeddedUser(dir), allowed everything (connect with
// EmbeddedAuth(dir)), and one user per part allowed only that part's row of the permission
// matrix for a system of partitions (EmbeddedPartAuth).
func Embedded(dir, listen string, sync Sync, partitions int, log *slog.Logger) (*server.Server, error) {
	user, err := EmbeddedUser(dir)
	if err != nil {
		return nil, err
	}
	parts, err := embeddedPartUsers(dir, partitions)
	if err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS address %q: bad port", listen)
	}
	if port == 0 {
		port = -1 // nats-server: -1 is a random port, 0 the default 4222
	}
	opts := &server.Options{
		ServerName: "locks-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(dir, "jetstream"),
		NoSigs:     true,
		NoLog:      true,
		// Readings are small; a batch of publishes must not be cut by the default payload.
		MaxPayload: 1 << 20,
		// Anyone who reaches the port could otherwise write READINGS and EVENTS.
		Nkeys: append([]*server.NkeyUser{{Nkey: user}}, parts...),
	}
	switch {
	case sync.Always:
		// As nats-server's own `sync: always` sets it: the interval stays for what it also paces.
		opts.SyncAlways, opts.SyncInterval = true, 2*time.Minute
	case sync.Interval > 0:
		opts.SyncInterval = sync.Interval
	default:
		return nil, errors.New("embedded NATS: no sync policy (natsx.ParseSync)")
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not become ready within 30s (store %s)", opts.StoreDir)
	}
	log.Info("embedded NATS server running", "url", ns.ClientURL(), "store", opts.StoreDir, "sync", sync.String(),
		"credential", EmbeddedNkeyFile(dir))
	return ns, nil
}

// EmbeddedAuth is how a client of the embedded server of data dir dir authenticates.
func EmbeddedAuth(dir string) Auth { return Auth{Nkey: EmbeddedNkeyFile(dir)} }

// Connect dials NATS with reconnects forever: parts ride out NATS restarts. extra carries
// credentials (Auth.Options) and anything a caller adds.
func Connect(url, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(64 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", redact.URL(c.ConnectedUrl())) }),
		// A publish or subscription the server's permissions refuse is reported only here;
		// a refused JetStream API request otherwise just times out.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Error("NATS subscription error", "subject", sub.Subject, "err", err)
				return
			}
			log.Error("NATS error", "err", err)
		}),
	}, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", redact.URL(url), redact.Error(err, url))
	}
	return nc, nil
}
