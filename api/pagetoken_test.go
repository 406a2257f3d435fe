package api

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

func TestPageTokenRoundTrip(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a", "xa7v9Dfadr7H", "cl_abcdefghijklmnopqrst", strings.Repeat("z", 300)} {
		tok := encodePageToken(listSensors, "connection=lost&data=", key)
		got, err := decodePageToken(tok, listSensors, "connection=lost&data=")
		if err != nil || got != key {
			t.Fatalf("%q: got %q, %v", key, got, err)
		}
		if _, err := decodePageToken(tok, listClients, "connection=lost&data="); err == nil {
			t.Fatalf("token of another list accepted")
		}
		if _, err := decodePageToken(tok, listSensors, "connection=&data="); err == nil {
			t.Fatalf("token of other filters accepted")
		}
		// Every single-byte change of the decoded token is refused.
		raw, _ := base64.RawURLEncoding.DecodeString(tok)
		for i := range raw {
			b := append([]byte(nil), raw...)
			b[i] ^= 0x01
			if _, err := decodePageToken(base64.RawURLEncoding.EncodeToString(b), listSensors, "connection=lost&data="); err == nil {
				t.Fatalf("token with byte %d changed accepted", i)
			}
		}
	}
}

// FuzzPageToken sends any page_token to a real server over REST and gRPC: the answer is
// 200 (only for a token this server made) or 400 naming page_token, never anything else.
func FuzzPageToken(f *testing.F) {
	e := newEnv(f, withStderrLog())
	ctx := f.Context()
	for _, id := range []string{"A1", "B2", "C3", "D4"} {
		if _, err := e.sensors.CreateSensor(ctx, &locksv1.CreateSensorRequest{Sensor: &locksv1.Sensor{Id: id, Address: "x"}}); err != nil {
			f.Fatal(err)
		}
	}
	res, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1})
	if err != nil {
		f.Fatal(err)
	}
	valid := res.GetNextPageToken()
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(valid + "A")
	f.Add(strings.ToUpper(valid))
	f.Add("")
	f.Add("AQI")
	f.Add("%%%")
	f.Add(strings.Repeat("A", 600))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 200, 1}))
	f.Add(encodePageToken(listClients, "", "A1"))
	f.Fuzz(func(t *testing.T, tok string) {
		_, decErr := decodePageToken(tok, listSensors, sensorFilter{}.scope())
		// A gRPC client cannot send a string that is not UTF-8 at all.
		if utf8.ValidString(tok) {
			_, err := e.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 2, PageToken: tok})
			switch st, _ := status.FromError(err); {
			case err == nil && decErr == nil:
			case err != nil && decErr != nil && st.Code() == codes.InvalidArgument && strings.Contains(st.Message(), "page_token"):
			default:
				t.Fatalf("token %q: gRPC %v, decode %v", tok, err, decErr)
			}
		}
		r := e.with(t).do("GET", "/v1/sensors?page_size=2&page_token="+url.QueryEscape(tok), nil)
		if (decErr == nil && r.status != 200) || (decErr != nil && (r.status != 400 || !strings.Contains(r.str("message"), "page_token"))) {
			t.Fatalf("token %q: REST %d %s", tok, r.status, r.raw)
		}
	})
}
