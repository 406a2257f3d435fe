package api

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// signedToken is a token whose MAC is right for whatever body it is given, to reach the
// checks behind the MAC.
func signedToken(body []byte) string {
	return base64.RawURLEncoding.EncodeToString(append(slices.Clone(body), tokenMAC(body)...))
}

func tokenBody(version byte, l list, scope string, keyLen uint64, key string) []byte {
	b := append([]byte{version, byte(l)}, scopeDigest(scope)...)
	b = binary.AppendUvarint(b, keyLen)
	return append(b, key...)
}

func TestDecodePageToken(t *testing.T) {
	t.Parallel()
	const scope = "connection=lost&data="
	valid := encodePageToken(listSensors, scope, "door-7")
	raw, _ := base64.RawURLEncoding.DecodeString(valid)
	const (
		damaged = "damaged or changed"
		other   = "another list or other filters"
	)
	cases := []struct {
		name, tok string
		l         list
		scope     string
		want      string // the key, when wantErr is ""
		wantErr   string // part of the message
	}{
		{"empty token: first page", "", listSensors, scope, "", ""},
		{"round trip", valid, listSensors, scope, "door-7", ""},
		{"round trip, empty scope", encodePageToken(listClients, "", "cl_1"), listClients, "", "cl_1", ""},
		{"round trip, empty key", encodePageToken(listSetAside, scope, ""), listSetAside, scope, "", ""},
		{"round trip, key with any bytes", encodePageToken(listDeadDeliveries, scope, "a/b\x00ü"), listDeadDeliveries, scope, "a/b\x00ü", ""},
		{"other list", valid, listClients, scope, "", other},
		{"other filters", valid, listSensors, "connection=&data=", "", other},
		{"sub-list of another parent", encodePageToken(listSensorClients, "sensor=A", "c1"), listSensorClients, "sensor=B", "", other},
		{"not base64", "%%%", listSensors, scope, "", damaged},
		{"padded base64", valid + "==", listSensors, scope, "", damaged},
		{"cut", valid[:len(valid)-2], listSensors, scope, "", damaged},
		{"extended", valid + "AA", listSensors, scope, "", damaged},
		{"too short", base64.RawURLEncoding.EncodeToString(raw[:10]), listSensors, scope, "", damaged},
		{"too long", encodePageToken(listSensors, scope, strings.Repeat("k", maxTokenLen)), listSensors, scope, "", damaged},
		{"made up MAC", base64.RawURLEncoding.EncodeToString(append(tokenBody(tokenVersion, listSensors, scope, 1, "x"), make([]byte, tokenMACLen)...)), listSensors, scope, "", damaged},
		{"other version, valid MAC", signedToken(tokenBody(tokenVersion+1, listSensors, scope, 1, "x")), listSensors, scope, "", damaged},
		{"length says more than the key", signedToken(tokenBody(tokenVersion, listSensors, scope, 5, "x")), listSensors, scope, "", damaged},
		{"length says less than the key", signedToken(tokenBody(tokenVersion, listSensors, scope, 1, "xy")), listSensors, scope, "", damaged},
		{"no length", signedToken(append([]byte{tokenVersion, byte(listSensors)}, scopeDigest(scope)...)), listSensors, scope, "", damaged},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := decodePageToken(c.tok, c.l, c.scope)
			if c.wantErr == "" {
				if err != nil || got != c.want {
					t.Fatalf("got %q, %v; want %q", got, err, c.want)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "page_token" || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("got %q, %v; want a page_token error saying %q", got, err, c.wantErr)
			}
		})
	}
}

func TestNextPage(t *testing.T) {
	t.Parallel()
	key := func(s string) string { return s }
	rows := []string{"a", "b", "c"}
	for _, c := range []struct {
		n        int
		want     []string
		wantNext string // the key the token continues after; "" for the last page
	}{
		{3, rows, ""},
		{4, rows, ""},
		{2, rows[:2], "b"},
		{1, rows[:1], "a"},
	} {
		page, tok := nextPage(rows, c.n, listSensors, "s", key)
		if !slices.Equal(page, c.want) {
			t.Errorf("n=%d: page %v, want %v", c.n, page, c.want)
		}
		if c.wantNext == "" {
			if tok != "" {
				t.Errorf("n=%d: token %q on the last page", c.n, tok)
			}
			continue
		}
		after, err := decodePageToken(tok, listSensors, "s")
		if err != nil || after != c.wantNext {
			t.Errorf("n=%d: token continues after %q (%v), want %q", c.n, after, err, c.wantNext)
		}
	}
}
