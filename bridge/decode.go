package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/lock-sensors/lock-sensors/internal/event"
)

// MaxBodySize is the largest body a reading may have (docs/contract.md section 1).
const MaxBodySize = 4 << 10

// ErrInvalid is matched (errors.Is) by every error Decode returns: the message is bad and
// will never become good by retrying, so it belongs in the invalid queue.
var ErrInvalid = errors.New("invalid reading")

// Reasons of an invalid message, as counted in the invalid metric.
const (
	ReasonTooBig   = "too_big"
	ReasonNotJSON  = "not_json"
	ReasonSensorID = "sensor_id"
	ReasonData     = "data"
	ReasonTS       = "ts"
	// ReasonMessageID: the AMQP message_id property is not a plain identifier.
	ReasonMessageID = "message_id"
)

// MaxMessageIDLen bounds the AMQP message_id the bridge accepts (AMQP allows 255 bytes).
const MaxMessageIDLen = 128

// CheckMessageID refuses an AMQP message_id that is not printable ASCII without spaces, or
// longer than MaxMessageIDLen: it becomes part of the Nats-Msg-Id header, where nats.go trims
// spaces and a CR or LF would end the header, so "a", " a" and "a\r\n" would name the same
// reading (or break the header), and two different readings would be recorded once.
func CheckMessageID(id string) error {
	if len(id) > MaxMessageIDLen {
		return invalid(ReasonMessageID, "message_id: longer than 128 bytes")
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f {
			return invalid(ReasonMessageID, "message_id: must be printable ASCII without spaces or control characters")
		}
	}
	return nil
}

// InvalidError says why a message is not a reading. Its Error() is what goes into the
// x-lock-sensors-error header: the field first, then what it must be.
type InvalidError struct {
	// Reason is one of the Reason constants.
	Reason string
	// Msg is the human-readable explanation, naming the field.
	Msg string
}

func (e *InvalidError) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(reason, msg string) error { return &InvalidError{Reason: reason, Msg: msg} }

// Reading is a valid sensor reading.
type Reading struct {
	SensorID string
	Data     uint8
	// Time is the sensor's ts, in UTC, or ReceivedTime when the sensor sent none.
	Time time.Time
	// HasTS says the sensor sent a ts.
	HasTS bool
	// ReceivedTime is the server time at which the bridge received the message.
	ReceivedTime time.Time
}

type rawReading struct {
	SensorID json.RawMessage `json:"sensor_id"`
	Data     json.RawMessage `json:"data"`
	TS       json.RawMessage `json:"ts"`
}

// Decode validates a message body per docs/contract.md section 1.
//
// Decisions where the contract is silent:
//   - data is the JSON number zero or one in any JSON spelling (0, 1, 1.0, 1e0, 10e-1, -0);
//     strings ("1"), booleans, null and any other value are invalid. The value is compared
//     exactly, so 0.99999999999999999999 is not 1.
//   - ts: null is the same as absent. A ts must be RFC 3339 (YYYY-MM-DDTHH:MM:SS, an
//     optional fraction, Z or ±HH:MM; t and z may be lower-case; no leap second 60) and,
//     once in UTC, within years 0000–9999.
//   - sensor_id is the decoded JSON string, so "\u0041" is "A".
//   - Duplicate keys: the last one wins, as in encoding/json.
func Decode(body []byte, receivedAt time.Time) (Reading, error) {
	if len(body) > MaxBodySize {
		return Reading{}, invalid(ReasonTooBig, "body: larger than 4 KiB")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Reading{}, invalid(ReasonNotJSON, "body: must be a JSON object")
	}
	raw, ok := scanReading(body)
	if !ok {
		raw = rawReading{}
		if err := json.Unmarshal(body, &raw); err != nil {
			return Reading{}, invalid(ReasonNotJSON, "body: must be a JSON object: "+err.Error())
		}
	}
	r := Reading{ReceivedTime: receivedAt}

	if raw.SensorID == nil {
		return Reading{}, invalid(ReasonSensorID, "sensor_id: missing; must be 1-16 ASCII letters or digits")
	}
	id, ok := jsonString(raw.SensorID)
	if !ok || !event.ValidSensorID(id) {
		return Reading{}, invalid(ReasonSensorID, "sensor_id: must be 1-16 ASCII letters or digits")
	}
	r.SensorID = id

	if raw.Data == nil {
		return Reading{}, invalid(ReasonData, "data: missing; must be the JSON number 0 or 1")
	}
	d, ok := zeroOrOne(raw.Data)
	if !ok {
		return Reading{}, invalid(ReasonData, "data: must be the JSON number 0 or 1")
	}
	r.Data = d

	r.Time = receivedAt
	if raw.TS != nil && string(raw.TS) != "null" {
		s, ok := jsonString(raw.TS)
		if !ok {
			return Reading{}, invalid(ReasonTS, "ts: must be an RFC 3339 time string")
		}
		// RFC 3339 allows a lower-case t and z; time.Parse wants them upper-case, and on its
		// own would also take what RFC 3339 does not (a comma fraction, a +24:00 offset).
		s = strings.ToUpper(s)
		if !rfc3339Shape(s) {
			return Reading{}, invalid(ReasonTS, "ts: must be an RFC 3339 time string")
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Reading{}, invalid(ReasonTS, "ts: must be an RFC 3339 time string")
		}
		t = t.UTC()
		if t.Year() < 0 || t.Year() > 9999 {
			return Reading{}, invalid(ReasonTS, "ts: out of range (years 0000-9999 in UTC)")
		}
		r.Time, r.HasTS = t, true
	}
	return r, nil
}

// jsonString reads a JSON token (already validated by json.Unmarshal) that must be a string.
// Without escapes its content is the bytes between the quotes; with escapes, encoding/json
// decodes it.
func jsonString(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(tok, '\\') < 0 {
		return string(tok[1 : len(tok)-1]), true
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", false
	}
	return s, true
}

// rfc3339Shape checks the layout YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM) with an offset
// of at most 23:59; time.Parse checks the ranges of the date and time fields.
func rfc3339Shape(s string) bool {
	if len(s) < 20 {
		return false
	}
	digit := func(c byte) bool { return '0' <= c && c <= '9' }
	for i := 0; i < 19; i++ {
		c := s[i]
		switch i {
		case 4, 7:
			if c != '-' {
				return false
			}
		case 10:
			if c != 'T' {
				return false
			}
		case 13, 16:
			if c != ':' {
				return false
			}
		default:
			if !digit(c) {
				return false
			}
		}
	}
	rest := s[19:]
	if rest[0] == '.' {
		j := 1
		for j < len(rest) && digit(rest[j]) {
			j++
		}
		if j == 1 {
			return false
		}
		rest = rest[j:]
	}
	if rest == "Z" {
		return true
	}
	if len(rest) != 6 || (rest[0] != '+' && rest[0] != '-') || rest[3] != ':' ||
		!digit(rest[1]) || !digit(rest[2]) || !digit(rest[4]) || !digit(rest[5]) {
		return false
	}
	hh := int(rest[1]-'0')*10 + int(rest[2]-'0')
	mm := int(rest[4]-'0')*10 + int(rest[5]-'0')
	return hh <= 23 && mm <= 59
}

// zeroOrOne reads a JSON token that must be a number whose exact value is 0 or 1. It parses
// the decimal by hand rather than with strconv or math/big: a float rounds
// (0.99999999999999999999 would be 1) and big.Rat would expand 1e999999999.
func zeroOrOne(tok []byte) (uint8, bool) {
	s := tok
	i := 0
	neg := false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	// Integer part: 0 or [1-9][0-9]*.
	start := i
	if i < len(s) && s[i] == '0' {
		i++
	} else {
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
	}
	if i == start {
		return 0, false
	}
	intDigits := s[start:i]
	var frac []byte
	if i < len(s) && s[i] == '.' {
		i++
		fs := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == fs {
			return 0, false
		}
		frac = s[fs:i]
	}
	exp := 0
	expBig := false
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		es := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			if exp < 1_000_000 {
				exp = exp*10 + int(s[i]-'0')
			} else {
				expBig = true
			}
			i++
		}
		if i == es {
			return 0, false
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(s) {
		return 0, false // not a JSON number (a string, true, null, an object, …)
	}
	// value = digits × 10^(exp - len(frac)), digits = intDigits ++ frac.
	digits := append(append([]byte{}, intDigits...), frac...)
	digits = bytes.TrimLeft(digits, "0")
	if len(digits) == 0 {
		return 0, true // zero, whatever the sign and exponent
	}
	if neg || expBig {
		return 0, false
	}
	e := exp - len(frac)
	trimmed := bytes.TrimRight(digits, "0")
	e += len(digits) - len(trimmed)
	if string(trimmed) == "1" && e == 0 {
		return 1, true
	}
	return 0, false
}
