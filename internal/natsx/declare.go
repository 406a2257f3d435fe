package natsx

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamsConfig is what Declare needs.
type StreamsConfig struct {
	Partitions int
	// Duplicates is the window in which a repeated Nats-Msg-Id is recorded once (default 2m:
	// long enough for RabbitMQ redeliveries and relay retries, short enough that a sensor
	// repeating the very same body without message_id or ts is not merged for long).
	Duplicates time.Duration
	// Replicas is how many servers keep each stream and bucket Declare creates
	// (LOCKS_NATS_REPLICAS): 1 for one server, 3 for a cluster. An existing stream with
	// more keeps them.
	Replicas int
	// LostAfter is the liveness bucket's limit-marker TTL floor.
	LostAfter time.Duration
	// LeaseTTL is the age at which an unrenewed partition lease lapses (LOCKS_LEASE_TTL;
	// default LeaseTTLDefault).
	LeaseTTL time.Duration
	// ReadingsMaxAge, EventsMaxAge and DeliveriesMaxAge limit how long the streams keep
	// messages (see MaxAge and applyMaxAges): READINGS and EVENTS for ever and DELIVERIES
	// DeliveriesMaxAgeDefault unless configured.
	ReadingsMaxAge, EventsMaxAge, DeliveriesMaxAge MaxAge
	// AtomicPublish lets READINGS, EVENTS and DELIVERIES take atomic batches (nats-server
	// 2.12+), which the bridge and the outbox relays then publish in: a server that syncs
	// every write syncs a batch once (see bridge/batch.go). An existing stream that allows
	// them keeps allowing them, unless AtomicPublishExact.
	AtomicPublish bool
	// AtomicPublishExact sets AtomicPublish on the three streams either way, taking it away
	// too: for the embedded server, whose syncing (LOCKS_NATS_SYNC) is this process's own, so
	// that a store first run with "always" and later with "2m" stops batching, which only
	// pays where every write is synced. An external server's operator may have allowed
	// batches: there, without it, they stay allowed.
	AtomicPublishExact bool
}

// LeaseTTLDefault is StreamsConfig.LeaseTTL's default.
const LeaseTTLDefault = 6 * time.Second

// LeasesBucket is the bucket of a part's partition leases (internal/lease).
func LeasesBucket(part string) string { return "leases_" + part }

// LeaseParts are the parts whose processes share partitions by leases.
var LeaseParts = []string{"state", "notifier", "watchdog"}

// LeasesConfig is the lease bucket of part: Declare creates it, and internal/lease creates it
// the same way where nothing declared it.
func LeasesConfig(c StreamsConfig, part string) jetstream.KeyValueConfig {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	return jetstream.KeyValueConfig{
		Bucket:      LeasesBucket(part),
		Description: "partition leases of the " + part + " processes (internal/lease)",
		History:     1,
		TTL:         c.LeaseTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
	}
}

// ErrIncompatible says an existing stream cannot be changed into the configured one.
var ErrIncompatible = errors.New("existing stream is incompatible with the configuration")

func readingsConfig(c StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        ReadingsStream,
		Description: "every sensor reading and liveness fact, partitioned by sensor",
		Subjects:    []string{ReadingsIn + "*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      ReadingsIn + "*",
			Destination: fmt.Sprintf("readings.{{partition(%d,1)}}.{{wildcard(1)}}", c.Partitions),
		},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		MaxAge:     c.ReadingsMaxAge.Age,
		Duplicates: c.Duplicates,
		Replicas:   c.Replicas,
		// The watchdog reads each expiring sensor's last message; direct gets skip the API queue.
		AllowDirect:        true,
		AllowAtomicPublish: c.AtomicPublish,
	}
}

func deliveriesConfig(c StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeliveriesStream,
		Description: "every webhook attempt, for the history projector",
		Subjects:    []string{"deliveries.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      c.DeliveriesMaxAge.orDefault(DeliveriesMaxAgeDefault),
		Duplicates:  c.Duplicates,
		Replicas:    c.Replicas,
		// The relays publish their rows in atomic batches where allowed (internal/outbox).
		AllowAtomicPublish: c.AtomicPublish,
	}
}

func eventsConfig(c StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "sensor events (state_changed, connection_lost, connection_restored)",
		Subjects:    []string{"events.*.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      c.EventsMaxAge.Age,
		Duplicates:  c.Duplicates,
		Replicas:    c.Replicas,
		// The relays publish their rows in atomic batches where allowed (internal/outbox).
		AllowAtomicPublish: c.AtomicPublish,
	}
}

func livenessConfig(c StreamsConfig) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      LivenessBucket,
		Description: "one key per sensor, refreshed by each reading, expiring after lost_after",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		// A marker must outlive an outage of the watchdog, which settles and overwrites it.
		LimitMarkerTTL: max(c.LostAfter, 24*time.Hour),
	}
}

func bridgeSessionsConfig(c StreamsConfig) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      BridgeSessionsBucket,
		Description: "per bridge session, the last AMQP delivery tag it acked (or is acking)",
		History:     1,
		TTL:         BridgeSessionsTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
	}
}

// Declare creates READINGS, EVENTS, DELIVERIES, SET_ASIDE, LOGS and the liveness, bridge_sessions,
// processes and lease buckets that are missing. One that exists keeps what an operator set (replicas, limits,
// placement, a longer duplicate window) and only gains what this system needs (see reconcile).
func Declare(ctx context.Context, js jetstream.JetStream, c StreamsConfig) error {
	if c.Partitions < 1 {
		return fmt.Errorf("partitions must be >= 1, got %d", c.Partitions)
	}
	if c.Replicas < 1 {
		c.Replicas = 1
	}
	if c.Duplicates <= 0 {
		c.Duplicates = 2 * time.Minute
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	for _, want := range []jetstream.StreamConfig{readingsConfig(c), eventsConfig(c), deliveriesConfig(c), setAsideConfig(c), logsConfig(c)} {
		err := declareStream(ctx, js, want, c.AtomicPublishExact, func(ctx context.Context) error {
			_, err := js.CreateStream(ctx, want)
			return err
		})
		if err != nil {
			return err
		}
	}
	kvs := []jetstream.KeyValueConfig{livenessConfig(c), bridgeSessionsConfig(c), processesConfig(c)}
	for _, part := range LeaseParts {
		kvs = append(kvs, LeasesConfig(c, part))
	}
	for _, kv := range kvs {
		err := declareStream(ctx, js, bucketStream(kv), false, func(ctx context.Context) error {
			_, err := js.CreateKeyValue(ctx, kv)
			return err
		})
		if err != nil {
			return fmt.Errorf("KV bucket %s: %w", kv.Bucket, err)
		}
	}
	return applyMaxAges(ctx, js, c)
}

// bucketStream is what reconcile checks of a bucket's stream: the settings of kv that the
// watchdog and bridge rely on. The bucket itself is created with kv, as nats.go lays it out.
func bucketStream(kv jetstream.KeyValueConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                   "KV_" + kv.Bucket,
		Description:            kv.Description,
		Subjects:               []string{"$KV." + kv.Bucket + ".>"},
		Storage:                kv.Storage,
		Retention:              jetstream.LimitsPolicy,
		Replicas:               kv.Replicas,
		AllowDirect:            true,
		AllowMsgTTL:            kv.LimitMarkerTTL > 0,
		SubjectDeleteMarkerTTL: kv.LimitMarkerTTL,
	}
}

// declareStream creates want's stream with create when it is missing, and otherwise updates
// it only if reconcile adds something, so that a start leaves an operator's stream untouched;
// exactAtomic: see StreamsConfig.AtomicPublishExact.
func declareStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, exactAtomic bool, create func(context.Context) error) error {
	s, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if err := create(ctx); err != nil {
			return fmt.Errorf("create stream %s with %d replicas: %w", want.Name, want.Replicas, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	next, err := reconcile(have, want)
	if exactAtomic {
		next.AllowAtomicPublish = want.AllowAtomicPublish
	}
	if err != nil {
		return err
	}
	if reflect.DeepEqual(next, have) {
		return nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("update stream %s to %d replicas: %w", want.Name, next.Replicas, err)
	}
	return nil
}

// reconcile is the configuration an existing stream should have: have, plus what want needs
// that have lacks. Limits, placement, discard policy and the like stay as they are (an
// operator's choice); replicas, the duplicate window and the marker TTL only ever grow. What
// cannot be reconciled in place without moving or losing messages is refused in one line.
func reconcile(have, want jetstream.StreamConfig) (jetstream.StreamConfig, error) {
	if (have.SubjectTransform == nil) != (want.SubjectTransform == nil) ||
		(have.SubjectTransform != nil && *have.SubjectTransform != *want.SubjectTransform) {
		return have, fmt.Errorf("%w: stream %s maps subjects %v, the configuration wants %v; "+
			"changing the partition count would move sensors between partitions. Keep "+
			"LOCKS_PARTITIONS as it was, or replay into a new stream", ErrIncompatible, want.Name,
			transformString(have.SubjectTransform), transformString(want.SubjectTransform))
	}
	grows := subset(have.Subjects, want.Subjects) && want.SubjectTransform == nil
	if !sameSet(have.Subjects, want.Subjects) && !grows {
		return have, fmt.Errorf("%w: stream %s has subjects %q, this system publishes to %q; "+
			"set them back (nats stream edit %s --subjects …)", ErrIncompatible, want.Name,
			have.Subjects, want.Subjects, want.Name)
	}
	if have.Storage != want.Storage {
		return have, fmt.Errorf("%w: stream %s has storage %s, this system needs %s; storage "+
			"cannot change in place: back the stream up, delete it, and restore it with %s storage",
			ErrIncompatible, want.Name, have.Storage, want.Storage, want.Storage)
	}
	if have.Retention != want.Retention {
		return have, fmt.Errorf("%w: stream %s has retention %s, this system needs %s (parts "+
			"and replays read it independently, one's ack must not remove a message); set it "+
			"back (nats stream edit %s --retention %s)", ErrIncompatible, want.Name,
			have.Retention, want.Retention, want.Name, want.Retention)
	}
	next := have
	if grows {
		// Subjects added (LOGS' per-part subjects): nothing stored moves.
		next.Subjects = want.Subjects
	}
	next.Replicas = max(have.Replicas, want.Replicas)
	next.Duplicates = max(have.Duplicates, want.Duplicates)
	if have.MaxAge > 0 {
		next.Duplicates = min(next.Duplicates, have.MaxAge) // the server refuses a window beyond MaxAge
	}
	next.AllowDirect = have.AllowDirect || want.AllowDirect
	next.AllowAtomicPublish = have.AllowAtomicPublish || want.AllowAtomicPublish
	next.AllowMsgTTL = have.AllowMsgTTL || want.AllowMsgTTL
	next.SubjectDeleteMarkerTTL = max(have.SubjectDeleteMarkerTTL, want.SubjectDeleteMarkerTTL)
	if next.Description == "" {
		next.Description = want.Description
	}
	return next, nil
}

// subset says every subject of a is in b.
func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func transformString(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return "(none)"
	}
	return t.Source + " → " + t.Destination
}
