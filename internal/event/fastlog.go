package event

import (
	"time"
	"unicode/utf8"
)

// decodeLogFast parses the READINGS envelope as this package writes it, without reflection:
// every reader of the log (state, history, watchdog) decodes every message, and
// encoding/json was the largest single cost of the pipeline's own CPU. It accepts only a
// plain subset of JSON (known keys spelled exactly, strings without escapes, integers
// without fraction or exponent) and reports ok=false for anything else, which DecodeLog then
// gives to encoding/json: the result is the same either way (FuzzDecodeLogFast checks it).
func decodeLogFast(b []byte) (m Log, ok bool) {
	p := fastParser{b: b}
	p.ws()
	if !p.byte('{') {
		return m, false
	}
	p.ws()
	if p.byte('}') {
		return m, p.end()
	}
	for {
		p.ws()
		key, kok := p.str()
		if !kok {
			return m, false
		}
		p.ws()
		if !p.byte(':') {
			return m, false
		}
		p.ws()
		switch string(key) {
		case "v":
			n, nok := p.int(1 << 31)
			if !nok {
				return m, false
			}
			m.V = int(n)
		case "kind", "sensor_id", "message_id", "origin":
			s, sok := p.str()
			if !sok {
				return m, false
			}
			*textField(&m, key) = string(s)
		case "data":
			n, nok := p.int(255)
			if !nok {
				return m, false
			}
			m.Data = uint8(n)
		case "lost_after":
			n, nok := p.int(1<<63 - 1)
			if !nok {
				return m, false
			}
			m.LostAfter = time.Duration(n)
		case "untracked":
			u, uok := p.bool()
			if !uok {
				return m, false
			}
			m.Untracked = u
		case "time", "received_time":
			start := p.i
			if _, sok := p.str(); !sok {
				return m, false
			}
			t, tok := fastUTC(b[start+1 : p.i-1])
			if !tok {
				// The same parser encoding/json would use, on the quoted string.
				if err := t.UnmarshalJSON(b[start:p.i]); err != nil {
					return m, false
				}
			}
			if string(key) == "time" {
				m.Time = t
			} else {
				m.ReceivedTime = t
			}
		default:
			return m, false
		}
		p.ws()
		if !p.byte(',') {
			return m, p.byte('}') && p.end()
		}
	}
}

// textField is the string field of m that key names: kind, sensor_id, origin or
// message_id.
func textField(m *Log, key []byte) *string {
	switch string(key) {
	case "kind":
		return &m.Kind
	case "sensor_id":
		return &m.SensorID
	case "origin":
		return &m.Origin
	}
	return &m.MessageID
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *fastParser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// lit reads the literal s (true or false).
func (p *fastParser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// bool reads true or false.
func (p *fastParser) bool() (v, ok bool) {
	switch {
	case p.lit("true"):
		return true, true
	case p.lit("false"):
		return false, true
	}
	return false, false
}

// end: only whitespace may follow the object.
func (p *fastParser) end() bool {
	p.ws()
	return p.i == len(p.b)
}

// str reads a string with no escapes and no control characters, valid UTF-8; the result
// aliases the input.
func (p *fastParser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

// int reads a non-negative integer without leading zeros, at most limit.
func (p *fastParser) int(limit uint64) (uint64, bool) {
	start := p.i
	var n uint64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		d := uint64(p.b[p.i] - '0')
		if n > (limit-d)/10 {
			return 0, false
		}
		n = n*10 + d
		p.i++
	}
	switch {
	case p.i == start, p.i-start > 1 && p.b[start] == '0':
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

// fastUTC parses the one form the pipeline writes, 2006-01-02T15:04:05[.fraction]Z with 1 to
// 9 fraction digits; anything else is left to time's own parser.
func fastUTC(s []byte) (time.Time, bool) {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	num := func(b []byte) (int, bool) {
		n := 0
		for _, c := range b {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(s[0:4])
	month, ok2 := num(s[5:7])
	day, ok3 := num(s[8:10])
	hour, ok4 := num(s[11:13])
	minute, ok5 := num(s[14:16])
	sec, ok6 := num(s[17:19])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || month < 1 || month > 12 || day < 1 ||
		day > daysIn(time.Month(month), year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if frac := s[19 : len(s)-1]; len(frac) > 0 {
		if frac[0] != '.' || len(frac) < 2 || len(frac) > 10 {
			return time.Time{}, false
		}
		n, ok := num(frac[1:])
		if !ok {
			return time.Time{}, false
		}
		for range 10 - len(frac) {
			n *= 10
		}
		nsec = n
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

func daysIn(m time.Month, year int) int {
	return time.Date(year, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}
