package bridge

// Reading identity (CONTRACT.md section 1). Every AMQP delivery is a reading, even when its
// body equals an earlier one: a door closed, opened and closed again sends the same body
// twice. Only two things are recognised as already recorded:
//
//   - a message whose message_id was already appended for the same sensor: its Nats-Msg-Id
//     is "m:<sensor_id>:<message_id>", so JetStream records it once within the stream's
//     de-duplication window, and equal message_ids of two sensors never meet;
//   - a message RabbitMQ redelivers (the redelivered flag) that an earlier bridge session
//     had appended before it died without acking it.
//
// Any other message is appended under the Nats-Msg-Id "o:<session>/<delivery tag>", unique
// to the delivery (a retry of the same append carries it too, so a retry is stored once).
//
// Telling a redelivered message that was appended from one that was not: every reading
// carries its Origin, "<session>/<delivery tag>", and before each AMQP ack a session records
// in the bridge_sessions bucket the tag it is about to ack (with the receive time of that
// delivery), so acked ≤ recorded always holds. The appended-but-unacked readings of a dead
// session S are then exactly its readings with a tag above S's record, and for one sensor they
// are a prefix, in order, of that sensor's unacked messages (the bridge appends a sensor's
// reading only after its previous one is durable). RabbitMQ requeues unacked messages in
// their original order, so the first redeliveries of a sensor are those readings, in order:
// a redelivered message is a duplicate exactly when it has the identity (message_id, or the
// digest of body and properties) of the sensor's next unclaimed candidate, and each
// candidate is claimed once. Because the comparison is with the next candidate only, two
// equal bodies can at worst be claimed in each other's place, which records the same
// readings. The residual ambiguity is written down in the README.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
)

// clockMargin widens the look-back of a redelivery check for a clock difference between the
// bridge (which stamps a record's since) and the NATS server (which stamps stored messages).
const clockMargin = time.Minute

// sessionRecord is a session's entry in the bridge_sessions bucket.
type sessionRecord struct {
	// Acked is the highest delivery tag the session has acked or is about to ack: it is
	// written before the AMQP ack, so every delivery above it was never acked.
	Acked uint64 `json:"acked"`
	// Since is the receive time of delivery Acked (or the session's start): every delivery
	// above Acked was received, and so appended, after it.
	Since time.Time `json:"since"`
}

// natsMsgID is the Nats-Msg-Id of a reading (see the package comment above).
func natsMsgID(sensorID, messageID, origin string) string {
	if messageID != "" {
		return "m:" + sensorID + ":" + messageID
	}
	return "o:" + origin
}

// session is one AMQP session's identity and its record in the bridge_sessions bucket.
type session struct {
	id string
	kv jetstream.KeyValue
	js jetstream.JetStream
	// others are the records of earlier sessions seen at the start: once this session has
	// acked every message RabbitMQ requeued before it started consuming, nothing they
	// appended can come back, and their records are deleted so that later checks look back
	// no further than they must.
	others []string
	// claimed are the origins of readings already matched with a redelivery by this session.
	claimed map[string]bool
	// firstFresh is the tag of the first delivery without the redelivered flag (0: none yet),
	// set by the reader and read by the acker.
	firstFresh atomic.Uint64
	pruned     bool
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// startSession opens the bucket, notes the records of earlier sessions and writes this
// session's first record before anything is consumed.
func startSession(ctx context.Context, js jetstream.JetStream, now time.Time) (*session, error) {
	kv, err := js.KeyValue(ctx, natsx.BridgeSessionsBucket)
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", natsx.BridgeSessionsBucket, err)
	}
	s := &session{id: newSessionID(), kv: kv, js: js, claimed: map[string]bool{}}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, fmt.Errorf("list bridge sessions: %w", err)
	}
	s.others = keys
	if err := s.record(ctx, 0, now); err != nil {
		return nil, err
	}
	return s, nil
}

// record writes that the session is about to ack every delivery up to tag.
func (s *session) record(ctx context.Context, tag uint64, since time.Time) error {
	b, _ := json.Marshal(sessionRecord{Acked: tag, Since: since.UTC()})
	if _, err := s.kv.Put(ctx, s.id, b); err != nil {
		return fmt.Errorf("record bridge session %s at tag %d: %w", s.id, tag, err)
	}
	return nil
}

// acked is told, after an ack, the highest tag acked: once it covers every delivery before
// the first fresh one, the earlier sessions' records are no longer needed.
func (s *session) acked(ctx context.Context, tag uint64, fresh uint64) {
	if s.pruned || fresh == 0 || tag+1 < fresh {
		return
	}
	s.pruned = true
	for _, k := range s.others {
		// Best effort: a record left behind costs only a longer look-back.
		_ = s.kv.Delete(ctx, k)
	}
}

// candidate is a reading an earlier session appended.
type candidate struct {
	origin   string
	identity string
	// unacked: its tag is above its session's record, so it was never acked.
	unacked bool
}

// appended tells whether a redelivered reading of sensor with identity id (its message_id,
// or the digest of body and properties) was already appended by an earlier session, and if
// so claims that reading.
//
// A strong identity (a message_id or a ts) names one reading: any
// unclaimed reading of the sensor with the same identity is this one. That also covers a
// RabbitMQ node that crashed and forgot acks it had received, which redelivers readings
// this bridge had acked. A weak identity (a bare {"sensor_id", "data"}) is matched only with
// the sensor's next unacked reading, as the package comment explains.
func (s *session) appended(ctx context.Context, sensor, id string, strong bool) (bool, error) {
	recs, err := s.records(ctx)
	if err != nil {
		return false, err
	}
	if len(recs) == 0 {
		return false, nil
	}
	since := time.Time{}
	for _, r := range recs {
		if since.IsZero() || r.Since.Before(since) {
			since = r.Since
		}
	}
	cands, err := s.candidates(ctx, sensor, since.Add(-clockMargin), recs)
	if err != nil {
		return false, err
	}
	for _, c := range cands {
		if s.claimed[c.origin] || !strong && !c.unacked {
			continue
		}
		if c.identity == id {
			s.claimed[c.origin] = true
			return true, nil
		}
		if !strong {
			return false, nil // not the next one: this message was never appended
		}
	}
	return false, nil
}

// records reads the other sessions' records afresh: an ack recorded a moment ago must be
// seen, or an acked reading could be taken for an unacked one.
func (s *session) records(ctx context.Context) (map[string]sessionRecord, error) {
	keys, err := s.kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list bridge sessions: %w", err)
	}
	recs := make(map[string]sessionRecord, len(keys))
	for _, k := range keys {
		if k == s.id {
			continue
		}
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read bridge session %s: %w", k, err)
		}
		var r sessionRecord
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			continue // not ours to judge; it only narrows what is recognised
		}
		recs[k] = r
	}
	return recs, nil
}

// candidates lists, in stream order, the sensor's readings stored since from sessions in
// recs with a tag above their record.
func (s *session) candidates(ctx context.Context, sensor string, since time.Time, recs map[string]sessionRecord) ([]candidate, error) {
	cons, err := s.js.CreateConsumer(ctx, natsx.ReadingsStream, jetstream.ConsumerConfig{
		Description:       "bridge: a redelivered reading's look-back",
		FilterSubject:     natsx.ReadingsSensorFilter(sensor),
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &since,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("read sensor %s's recent readings: %w", sensor, err)
	}
	defer func() {
		_ = s.js.DeleteConsumer(context.WithoutCancel(ctx), natsx.ReadingsStream, cons.CachedInfo().Name)
	}()
	pending := int(cons.CachedInfo().NumPending)
	var out []candidate
	for pending > 0 {
		batch, err := cons.Fetch(min(pending, 500), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("read sensor %s's recent readings: %w", sensor, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			pending--
			l, err := event.DecodeLog(m.Data())
			if err != nil || l.Kind != event.KindReading || l.SensorID != sensor {
				continue
			}
			sess, tagStr, ok := strings.Cut(l.Origin, "/")
			if !ok {
				continue
			}
			r, known := recs[sess]
			tag, err := strconv.ParseUint(tagStr, 10, 64)
			if !known || err != nil {
				continue
			}
			out = append(out, candidate{origin: l.Origin, identity: l.MessageID, unacked: tag > r.Acked})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("read sensor %s's recent readings: %w", sensor, err)
		}
		if got == 0 {
			return nil, fmt.Errorf("read sensor %s's recent readings: %d announced, none came", sensor, pending)
		}
	}
	return out, nil
}
