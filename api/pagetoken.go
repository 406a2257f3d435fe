package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
)

// A page token is the last key of the previous page (keyset paging: rows are read in key
// order after it, so rows inserted or deleted meanwhile never shift a page), bound to the
// list and filters it was made for, with a MAC so that a token that was cut, changed or made
// up is refused with INVALID_ARGUMENT instead of silently listing something else. The key is
// not secret: the token only carries a key the caller has seen, and the MAC guards integrity.
//
//	version(1) | list(1) | scope digest(8) | key length (uvarint) | key | mac(16), base64url
const (
	tokenVersion   = 1
	tokenDigestLen = 8
	tokenMACLen    = 16
	maxTokenLen    = 512
)

var tokenMACKey = []byte("lock-sensors api page token v1")

// list identifies which list a token belongs to.
type list byte

const (
	listClients list = iota + 1
	listSensors
	listSensorClients
	listClientSensors
	listDeadDeliveries
	listSetAside
)

func scopeDigest(scope string) []byte {
	d := sha256.Sum256([]byte(scope))
	return d[:tokenDigestLen]
}

func tokenMAC(b []byte) []byte {
	m := hmac.New(sha256.New, tokenMACKey)
	m.Write(b)
	return m.Sum(nil)[:tokenMACLen]
}

// encodePageToken makes the token of the page after key. scope holds the request's filters
// (and parent id) in a canonical form.
func encodePageToken(l list, scope, key string) string {
	b := make([]byte, 0, 2+tokenDigestLen+binary.MaxVarintLen64+len(key)+tokenMACLen)
	b = append(b, tokenVersion, byte(l))
	b = append(b, scopeDigest(scope)...)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = append(b, tokenMAC(b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken returns the key a token continues after; "" for the empty token (the
// first page). Every failure is a FieldError naming page_token.
func decodePageToken(tok string, l list, scope string) (string, error) {
	if tok == "" {
		return "", nil
	}
	bad := fieldErr("page_token", "not a page token of this API (damaged or changed); pass next_page_token exactly as it was returned, or nothing for the first page")
	if len(tok) > maxTokenLen {
		return "", bad
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 2+tokenDigestLen+1+tokenMACLen {
		return "", bad
	}
	body, mac := b[:len(b)-tokenMACLen], b[len(b)-tokenMACLen:]
	if !hmac.Equal(mac, tokenMAC(body)) || body[0] != tokenVersion {
		return "", bad
	}
	if list(body[1]) != l || !hmac.Equal(body[2:2+tokenDigestLen], scopeDigest(scope)) {
		return "", fieldErr("page_token", "belongs to another list or other filters; keep the filters of the first page, or start again without page_token")
	}
	rest := body[2+tokenDigestLen:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n != uint64(len(rest)-k) {
		return "", bad
	}
	return string(rest[k:]), nil
}

// nextPage cuts rows, read with LIMIT n+1, to a page of n, and makes the token of the page
// after it from the key of its last row ("" when rows held no more than n: the last page).
func nextPage[T any](rows []T, n int, l list, scope string, key func(T) string) ([]T, string) {
	if len(rows) <= n {
		return rows, ""
	}
	return rows[:n], encodePageToken(l, scope, key(rows[n-1]))
}
