package bridge

// scanReading reads a reading's body as sensors send it ({"sensor_id":"…","data":0,"ts":"…"},
// in any order and spacing) without encoding/json, which was the bridge's largest cost per
// reading. It takes only a plain subset of JSON: the three keys spelled exactly, strings of
// printable ASCII without escapes, numbers, and ts null. For anything else it says ok=false
// and Decode asks encoding/json, so the outcome is the same either way (FuzzScanReading).
func scanReading(b []byte) (raw rawReading, ok bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return raw, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return raw, skipWS(b, i+1) == len(b)
	}
	for {
		key, j, kok := scanString(b, i)
		if !kok {
			return raw, false
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ':' {
			return raw, false
		}
		i = skipWS(b, i+1)
		var tok []byte
		switch string(key[1 : len(key)-1]) {
		case "sensor_id":
			tok, i, ok = scanString(b, i)
			raw.SensorID = tok
		case "ts":
			if len(b)-i >= 4 && string(b[i:i+4]) == "null" {
				tok, i, ok = b[i:i+4], i+4, true
			} else {
				tok, i, ok = scanString(b, i)
			}
			raw.TS = tok
		case "data":
			tok, i, ok = scanNumber(b, i)
			raw.Data = tok
		default:
			// encoding/json matches keys without regard to case, and skips unknown ones.
			return raw, false
		}
		if !ok {
			return raw, false
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return raw, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return raw, skipWS(b, i+1) == len(b)
		default:
			return raw, false
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the string token at b[i:] with its quotes, and where it ends; only
// printable ASCII without a backslash is taken.
func scanString(b []byte, i int) (tok []byte, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i : j+1], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, i, false
		}
	}
	return nil, i, false
}

// scanNumber returns the JSON number token at b[i:] (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?).
func scanNumber(b []byte, i int) (tok []byte, end int, ok bool) {
	start := i
	digits := func() bool {
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return nil, start, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return nil, start, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return nil, start, false
		}
	}
	return b[start:i], i, true
}
