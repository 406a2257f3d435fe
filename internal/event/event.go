// Package event defines the versioned messages of the two logs: what is appended to
// READINGS (a sensor's reading, or a liveness fact from the watchdog) and what the state
// projector publishes to EVENTS. They are JSON with a version field "v"; a reader refuses a
// version it does not know rather than guess.
package event

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Version is the envelope version written by this binary.
const Version = 1

// Kinds of READINGS messages.
const (
	KindReading         = "reading"
	KindLivenessTimeout = "liveness_timeout"
)

// Types of EVENTS messages (the webhook `type` is "sensor." + Type).
const (
	TypeStateChanged       = "state_changed"
	TypeConnectionLost     = "connection_lost"
	TypeConnectionRestored = "connection_restored"
)

// ErrVersion is returned for an envelope of an unknown version.
var ErrVersion = errors.New("unknown envelope version")

// Log is one READINGS message.
//
// For a reading: Data, Time (the sensor's ts, or ReceivedTime when it sent none),
// ReceivedTime (server time, which decides liveness), MessageID (the AMQP message_id, or a
// digest of the body and properties when it had none) and Origin, the AMQP delivery that
// carried it ("<bridge session>/<delivery tag>"), which lets a bridge tell a redelivered
// message that was already appended from one that was not (see bridge/identity.go).
//
// For a liveness_timeout: ReceivedTime is the server time at which the watchdog saw the
// sensor's key expire, and LostAfter the timeout in force for the sensor then, so that the
// state projector decides from the log alone, the same way on every replay.
//
// Untracked marks a reading of an unregistered sensor that the bridge recorded beyond
// LOCKS_UNREGISTERED_MAX: it stays in the log (and its history), but no part keeps state,
// a liveness key or memory for it. The bridge decides it once, so every consumer, replay and
// rebuild follows the same decision (docs/security.md, Unregistered sensors).
type Log struct {
	V            int           `json:"v"`
	Kind         string        `json:"kind"`
	SensorID     string        `json:"sensor_id"`
	Data         uint8         `json:"data"`
	Time         time.Time     `json:"time"`
	ReceivedTime time.Time     `json:"received_time"`
	MessageID    string        `json:"message_id,omitempty"`
	Origin       string        `json:"origin,omitempty"`
	LostAfter    time.Duration `json:"lost_after,omitempty"`
	Untracked    bool          `json:"untracked,omitempty"`
}

// DecodeLog parses a READINGS message.
func DecodeLog(b []byte) (Log, error) {
	m, ok := decodeLogFast(b)
	if !ok {
		m = Log{}
		if err := json.Unmarshal(b, &m); err != nil {
			return m, fmt.Errorf("decode READINGS message: %w", err)
		}
	}
	if m.V != Version {
		return m, fmt.Errorf("%w %d in READINGS message", ErrVersion, m.V)
	}
	return m, nil
}

// Event is one EVENTS message. Its JSON is the webhook body of docs/contract.md section 2 minus
// the sensor's address (read afresh at delivery), plus what the notifier and history need.
type Event struct {
	V            int       `json:"v"`
	ID           string    `json:"id"`
	Type         string    `json:"type"`
	OccurredAt   time.Time `json:"occurred_at"`
	SensorID     string    `json:"sensor_id"`
	Data         uint8     `json:"data"`
	PreviousData *uint8    `json:"previous_data"`
	Revision     int64     `json:"revision"`
	// Partition and Seq locate the READINGS message that caused the event.
	Partition int    `json:"partition"`
	Seq       uint64 `json:"seq"`
}

// DecodeEvent parses an EVENTS message.
func DecodeEvent(b []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("decode EVENTS message: %w", err)
	}
	if e.V != Version {
		return e, fmt.Errorf("%w %d in EVENTS message", ErrVersion, e.V)
	}
	return e, nil
}

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// ID is the event id of a sensor's revision: "evt_" and 26 base32 characters of a digest.
// It is derived, not random, so that a replay or rebuild re-derives the very same ids and
// JetStream's Nats-Msg-Id de-duplication and receivers' webhook-id de-duplication hold.
func ID(sensorID string, revision int64) string {
	h := sha256.Sum256([]byte(sensorID + "/" + strconv.FormatInt(revision, 10)))
	return "evt_" + strings.ToLower(b32.EncodeToString(h[:])[:26])
}

// Outcomes of a webhook attempt.
const (
	OutcomeDelivered  = "delivered"  // a 2xx within the timeout
	OutcomeRetry      = "retry"      // failed; another attempt is scheduled
	OutcomeDead       = "dead"       // failed on the last attempt: dead-lettered
	OutcomeCancelled  = "cancelled"  // client deleted or unsubscribed before this attempt
	OutcomeSuperseded = "superseded" // a newer event of the sensor replaced this one
)

// Attempt is one DELIVERIES message: the record of one webhook attempt, published by the
// notifier and written to ClickHouse by the history projector.
type Attempt struct {
	V          int       `json:"v"`
	EventID    string    `json:"event_id"`
	ClientID   string    `json:"client_id"`
	SensorID   string    `json:"sensor_id"`
	Attempt    int       `json:"attempt"`
	Time       time.Time `json:"time"`
	StatusCode int       `json:"status_code"`
	LatencyMS  int64     `json:"latency_ms"`
	Error      string    `json:"error,omitempty"`
	Outcome    string    `json:"outcome"`
}

// AttemptMsgID is the Nats-Msg-Id of an attempt record, so a re-published record is stored once.
func AttemptMsgID(a Attempt) string {
	return a.EventID + "/" + a.ClientID + "/" + strconv.Itoa(a.Attempt) + "/" + a.Outcome
}

// DecodeAttempt parses a DELIVERIES message.
func DecodeAttempt(b []byte) (Attempt, error) {
	var a Attempt
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("decode DELIVERIES message: %w", err)
	}
	if a.V != Version {
		return a, fmt.Errorf("%w %d in DELIVERIES message", ErrVersion, a.V)
	}
	return a, nil
}
