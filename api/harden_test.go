package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// countingBody counts the bytes a handler reads from a request body.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// A REST request without a valid token is refused with 401 before its body is read, whatever
// the body: large, malformed or valid. With the token, the same malformed body is read and
// refused with 400 (so the counter does see reads).
func TestRESTUnauthenticatedBodyIsNotRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var read atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = countingBody{r.Body, &read}
		e.srv.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)

	post := func(auth string, body []byte) (int, http.Header, string) {
		t.Helper()
		read.Store(0)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+"/v1/clients", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	bodies := map[string][]byte{
		"large":     bytes.Repeat([]byte("a"), 4<<20),
		"malformed": []byte(`{"name": "n", "webhook_url": `),
		"valid":     []byte(`{"name": "n", "webhook_url": "https://203.0.113.7/hook"}`),
	}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789abcdef", "Basic dXNlcjpwdw=="} {
		for name, body := range bodies {
			st, h, b := post(auth, body)
			if st != http.StatusUnauthorized || !strings.Contains(b, `"code":16`) || h.Get("WWW-Authenticate") == "" {
				t.Errorf("authorization %q, %s body: %d %s (WWW-Authenticate %q), want 401 UNAUTHENTICATED",
					auth, name, st, b, h.Get("WWW-Authenticate"))
			}
			if n := read.Load(); n != 0 {
				t.Errorf("authorization %q, %s body: the handler read %d bytes of it before refusing", auth, name, n)
			}
		}
	}
	if st, _, b := post("Bearer "+testToken, bodies["malformed"]); st != http.StatusBadRequest || read.Load() == 0 {
		t.Fatalf("with the token, a malformed body: %d %s after reading %d bytes; want 400 after reading it", st, b, read.Load())
	}
}
