package event

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/lock-sensors/lock-sensors/internal/partition"
)

// ErrInvalid marks a log message that can never be applied, however often it is retried:
// it is set aside (see internal/setaside) and its partition moves on. Every error of
// CheckLog and CheckEvent wraps it, as an *InvalidError naming the reason.
var ErrInvalid = errors.New("invalid log message")

// Reasons a message is set aside: short, fixed labels (they are a metric label).
const (
	ReasonDecode       = "decode"        // not the JSON envelope
	ReasonVersion      = "version"       // an envelope version this binary does not know
	ReasonKind         = "kind"          // an unknown READINGS kind or EVENTS type
	ReasonSensorID     = "sensor_id"     // not 1 to 16 ASCII letters and digits
	ReasonSubject      = "subject"       // the subject is not the sensor's, or not its partition's
	ReasonData         = "data"          // data not 0/1 (or previous_data)
	ReasonReceivedTime = "received_time" // received_time missing
	ReasonLostAfter    = "lost_after"    // a liveness_timeout without a positive lost_after
	ReasonRevision     = "revision"      // revision below 1 or beyond MaxRevision
	ReasonEventID      = "event_id"      // id is not ID(sensor, revision)
	ReasonTime         = "occurred_at"   // an event without its time
	// ReasonRevisionAhead: an event whose revision the sensor's state has not reached, which
	// only a forger can publish (the outbox is written with the state); see the notifier.
	ReasonRevisionAhead = "revision_ahead"
)

// MaxRevision bounds a sane revision: a sensor changing every second for 30,000 years stays
// below it, while a forged 2^62 (meant to supersede every later real event) does not.
const MaxRevision = 1 << 40

// MaxSensorID is the longest sensor id of docs/contract.md section 1.
const MaxSensorID = 16

// InvalidError says why a log message was refused.
type InvalidError struct {
	Reason string // one of the Reason constants
	Detail string
}

func (e *InvalidError) Error() string { return e.Reason + ": " + e.Detail }

// Unwrap makes every InvalidError match ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// Invalid builds an *InvalidError.
func Invalid(reason, format string, args ...any) error {
	return &InvalidError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf is the reason of an error that wraps an *InvalidError ("" for any other error).
func ReasonOf(err error) string {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return ""
}

// ValidSensorID reports whether id is 1 to 16 ASCII letters and digits (docs/contract.md).
func ValidSensorID(id string) bool {
	if len(id) == 0 || len(id) > MaxSensorID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// quote shows a sensor id from an untrusted message, bounded, with control bytes escaped.
func quote(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:40]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
	}
	return strconv.Quote(s)
}

// checkSubject: subject must be <prefix>.<partition>.<sensor>, the partition being the
// sensor's among partitions (0: the number is not checked, for a reader that does not know
// the count).
func checkSubject(subject, prefix, sensor string, partitions int) error {
	want := strconv.Itoa(partition.Of(sensor, max(partitions, 1)))
	p, id, ok := strings.Cut(strings.TrimPrefix(subject, prefix+"."), ".")
	if !strings.HasPrefix(subject, prefix+".") || !ok || id != sensor || (partitions > 0 && p != want) {
		return Invalid(ReasonSubject, "subject %s is not %s.%s.%s", quote(subject), prefix, want, sensor)
	}
	return nil
}

// CheckLog decodes and checks a READINGS message stored under subject
// (readings.<partition>.<sensor_id>) in a stream of partitions partitions. Every error
// wraps ErrInvalid: nothing about the message will change on a retry.
func CheckLog(subject string, b []byte, partitions int) (Log, error) {
	l, err := DecodeLog(b)
	switch {
	case errors.Is(err, ErrVersion):
		return l, Invalid(ReasonVersion, "%v", err)
	case err != nil:
		return l, Invalid(ReasonDecode, "%v", err)
	case l.Kind != KindReading && l.Kind != KindLivenessTimeout:
		return l, Invalid(ReasonKind, "unknown kind %s", quote(l.Kind))
	case !ValidSensorID(l.SensorID):
		return l, Invalid(ReasonSensorID, "sensor_id %s is not 1 to 16 ASCII letters and digits", quote(l.SensorID))
	case l.Data > 1:
		return l, Invalid(ReasonData, "data %d is not 0 or 1", l.Data)
	case l.ReceivedTime.IsZero():
		return l, Invalid(ReasonReceivedTime, "no received_time")
	case l.Kind == KindLivenessTimeout && l.LostAfter <= 0:
		return l, Invalid(ReasonLostAfter, "liveness_timeout without lost_after")
	}
	if err := checkSubject(subject, "readings", l.SensorID, partitions); err != nil {
		return l, err
	}
	return l, nil
}

// CheckEvent decodes and checks an EVENTS message stored under subject
// (events.<partition>.<sensor_id>) in a log of partitions partitions. It cannot tell a
// forged revision that is sane from a real one: a reader that can, compares it with the
// sensor's state (ReasonRevisionAhead). Every error wraps ErrInvalid.
func CheckEvent(subject string, b []byte, partitions int) (Event, error) {
	e, err := DecodeEvent(b)
	switch {
	case errors.Is(err, ErrVersion):
		return e, Invalid(ReasonVersion, "%v", err)
	case err != nil:
		return e, Invalid(ReasonDecode, "%v", err)
	case e.Type != TypeStateChanged && e.Type != TypeConnectionLost && e.Type != TypeConnectionRestored:
		return e, Invalid(ReasonKind, "unknown type %s", quote(e.Type))
	case !ValidSensorID(e.SensorID):
		return e, Invalid(ReasonSensorID, "sensor_id %s is not 1 to 16 ASCII letters and digits", quote(e.SensorID))
	case e.Data > 1 || e.PreviousData != nil && *e.PreviousData > 1:
		return e, Invalid(ReasonData, "data or previous_data is not 0 or 1")
	case e.Revision < 1 || e.Revision > MaxRevision:
		return e, Invalid(ReasonRevision, "revision %d not in 1..2^40", e.Revision)
	case e.ID != ID(e.SensorID, e.Revision):
		return e, Invalid(ReasonEventID, "id %s is not the id of revision %d", quote(e.ID), e.Revision)
	case e.OccurredAt.IsZero():
		return e, Invalid(ReasonTime, "no occurred_at")
	}
	if err := checkSubject(subject, "events", e.SensorID, partitions); err != nil {
		return e, err
	}
	if partitions > 0 && e.Partition != partition.Of(e.SensorID, partitions) {
		return e, Invalid(ReasonSubject, "partition %d is not the sensor's", e.Partition)
	}
	return e, nil
}
