package bridge

// Reading identity (docs/contract.md section 1). Every AMQP delivery is a reading, even when its
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
// readings. The residual ambiguity is written down in docs/contract.md, "Redelivered readings".

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/logread"
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

// A session rewrites its record at least every heartbeatEvery, so that a record untouched
// for staleAfter belongs to a session that died that long ago. RabbitMQ requeues a dead
// session's unacked messages within seconds (at worst two AMQP heartbeats), and the
// requeued messages go to the head of the queue: a session that has itself been consuming
// for staleAfter has seen them come back by then, and deletes the stale record, so that
// look-backs reach no further than they must.
const (
	heartbeatEvery = 30 * time.Second
	staleAfter     = 10 * time.Minute
)

// session is one AMQP session's identity and its record in the bridge_sessions bucket.
// record, heartbeat and prune run on the acker's goroutine only; appended on the reader's.
type session struct {
	id      string
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	started time.Time
	// last is the record last written, rewritten unchanged by heartbeat; lastPut its time.
	last      sessionRecord
	lastPut   time.Time
	lastPrune time.Time
	// claimed are the origins of readings already matched with a redelivery by this session.
	claimed map[string]bool
	// recs and cands cache the earlier sessions' records and each sensor's candidates
	// (sensorCandidates); like claimed, only the reader goroutine touches them.
	recs  map[string]sessionRecord
	cands map[string][]candidate
}

func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// startSession opens the bucket and writes this session's first record before anything is
// consumed.
func startSession(ctx context.Context, js jetstream.JetStream, now time.Time) (*session, error) {
	kv, err := js.KeyValue(ctx, natsx.BridgeSessionsBucket)
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", natsx.BridgeSessionsBucket, err)
	}
	s := &session{id: newSessionID(), kv: kv, js: js, started: now, lastPrune: now, claimed: map[string]bool{}, cands: map[string][]candidate{}}
	if err := s.record(ctx, 0, now); err != nil {
		return nil, err
	}
	return s, nil
}

// record writes that the session is about to ack every delivery up to tag.
func (s *session) record(ctx context.Context, tag uint64, since time.Time) error {
	r := sessionRecord{Acked: tag, Since: since.UTC()}
	b, _ := json.Marshal(r)
	if _, err := s.kv.Put(ctx, s.id, b); err != nil {
		return fmt.Errorf("record bridge session %s at tag %d: %w", s.id, tag, err)
	}
	s.last, s.lastPut = r, time.Now()
	return nil
}

// heartbeat rewrites the last record, unchanged, when it is older than heartbeatEvery, and
// now and then deletes other sessions' stale records. Failures only cost a longer look-back
// elsewhere; they are retried at the next call.
func (s *session) heartbeat(ctx context.Context) {
	now := time.Now()
	if now.Sub(s.lastPut) >= heartbeatEvery {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		hctx, cancelLost := natsx.UntilLost(hctx, s.js.Conn())
		_ = s.record(hctx, s.last.Acked, s.last.Since)
		cancelLost()
		cancel()
	}
	if now.Sub(s.lastPrune) < heartbeatEvery || now.Sub(s.started) < staleAfter {
		return
	}
	s.lastPrune = now
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := s.kv.Keys(pctx)
	if err != nil {
		return
	}
	for _, k := range keys {
		if k == s.id {
			continue
		}
		if e, err := s.kv.Get(pctx, k); err == nil && now.Sub(e.Created()) > staleAfter {
			_ = s.kv.Delete(pctx, k)
		}
	}
}

// sensorCandidates are the sensor's readings from earlier sessions, read once per session:
// this session consumes the queue alone (an exclusive consumer), so the sessions that
// appended them are gone and their records final, and no other session takes deliveries while
// it runs; its own are not candidates. (A bridge cut off from RabbitMQ may still finish an
// append it had begun after this session read its candidates: a redelivery of that one is
// appended again, a reading recorded twice, never one lost.)
func (s *session) sensorCandidates(ctx context.Context, sensor string) ([]candidate, error) {
	if c, ok := s.cands[sensor]; ok {
		return c, nil
	}
	if s.recs == nil {
		recs, err := s.records(ctx)
		if err != nil {
			return nil, err
		}
		s.recs = recs
		if s.recs == nil {
			s.recs = map[string]sessionRecord{}
		}
	}
	var cands []candidate
	if len(s.recs) > 0 {
		since := time.Time{}
		for _, r := range s.recs {
			if since.IsZero() || r.Since.Before(since) {
				since = r.Since
			}
		}
		var err error
		if cands, err = s.candidates(ctx, sensor, since.Add(-clockMargin), s.recs); err != nil {
			return nil, err
		}
	}
	s.cands[sensor] = cands
	return cands, nil
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
	cands, err := s.sensorCandidates(ctx, sensor)
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

// records reads the other sessions' records.
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
	rd, err := logread.Open(ctx, s.js, logread.Spec{
		Stream: natsx.ReadingsStream, Filter: natsx.ReadingsSensorFilter(sensor),
		Description: "bridge: a redelivered reading's look-back",
		AckPolicy:   jetstream.AckNonePolicy, StartTime: &since,
		InactiveThreshold: time.Minute, MemoryStorage: true,
	})
	if err != nil {
		return nil, fmt.Errorf("read sensor %s's recent readings: %w", sensor, err)
	}
	defer rd.Close(ctx)
	pending := int(rd.Pending())
	var out []candidate
	empty := 0
	for pending > 0 {
		msgs, err := rd.Fetch(ctx, min(pending, 500), 5*time.Second)
		if err != nil {
			return nil, fmt.Errorf("read sensor %s's recent readings: %w", sensor, err)
		}
		if len(msgs) == 0 {
			// In a cluster the new consumer may live on a server whose interest has not
			// reached the one this connection is on yet: its first pulls find nothing.
			if empty++; empty > 10 {
				return nil, fmt.Errorf("read sensor %s's recent readings: %d announced, none came", sensor, pending)
			}
			if !backoff.Sleep(ctx, time.Duration(empty)*50*time.Millisecond) {
				return nil, ctx.Err()
			}
			continue
		}
		for _, m := range msgs {
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
	}
	return out, nil
}
