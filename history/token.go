package history

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// pageToken is where the previous page ended: the last row's time in ms (T) and its
// tie-breaker (S: a stream sequence or an attempt number; ID: an event id), plus a digest of
// the query (Q) so a token is not silently applied to another sensor or range. Base64 of JSON:
// opaque to clients, but readable when debugging.
type pageToken struct {
	Q  string `json:"q"`
	T  int64  `json:"t"`
	S  uint64 `json:"s,omitempty"`
	ID string `json:"i,omitempty"`
}

// maxTokenLen bounds what is decoded: a token is never longer than a few hundred bytes.
const maxTokenLen = 1024

func encodePageToken(t pageToken) string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string) (pageToken, error) {
	var t pageToken
	if len(s) > maxTokenLen {
		return t, invalid("page_token", "malformed")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return t, invalid("page_token", "malformed")
	}
	if err := json.Unmarshal(b, &t); err != nil || t.Q == "" || t.T < 0 || t.T > maxMS+999 || len(t.ID) > 256 {
		return t, invalid("page_token", "malformed")
	}
	return t, nil
}

// fingerprint ties a token to its list, id, range and order.
func fingerprint(kind, id string, w window) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%d\x00%d\x00%t", kind, id, w.start, w.end, w.newest))
	return hex.EncodeToString(h[:8])
}
