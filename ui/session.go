package ui

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Sessions are stateless: the cookie holds an expiry, a random nonce, a fingerprint of the
// token signed in with (an HMAC under the sessions' key, so the cookie gives no way to test
// guesses of the token) and the time of its last use, sealed with an HMAC whose key is
// derived from all the API tokens. So a session survives an API restart and works on every
// API instance with the same LOCKS_API_TOKENS, and dropping a token from LOCKS_API_TOKENS
// ends its sessions at once. The token itself never leaves the server.
//
// A session unused for IdleTimeout ends (each use more than idleRefresh after the last one
// rewrites the cookie's last-use time). Logout revokes the session's nonce on this process
// until the session would have expired; on other API processes, a copied cookie still ends
// at its idle timeout.
//
// A client's session (signed in with a client token, client.go) carries the token itself,
// sealed with AES-GCM under a key derived from the sessions' key, after the same fields: the
// dashboard calls the API with it, so the API's own rules (api/authz.go) bound what the page
// can do, and deleting the token ends its sessions at their next request on every instance.

const (
	cookieName = "locks_session"
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

var errNoSession = errors.New("no valid session")

type session struct {
	expires time.Time
	active  time.Time // last use, as the cookie says
	nonce   [16]byte
	token   string // the API token the session signed in with
	client  bool   // token is a client token (client.go), not an administrator's
	// clientID is the client of a client token, looked up at each request (UI.session).
	clientID string
}

// idleRefresh is how stale a cookie's last-use time may be before a use rewrites it: not at
// every one of the panels' refreshes.
const idleRefresh = time.Minute

// maxRevoked bounds the revoked sessions remembered; past it the ones expiring first go.
const maxRevoked = 100_000

// cookie layout: expires (8) | nonce (16) | token fingerprint (16) | last use (8), and for a
// client's session the sealed client token: GCM nonce (12) | ciphertext and tag.
const cookieBodyLen = 8 + 16 + 16 + 8

// maxSealedToken bounds the sealed client token a cookie may hold.
const maxSealedToken = 12 + 256 + 16

type sessions struct {
	key    []byte
	tokens []string
	ttl    time.Duration
	idle   time.Duration

	mu      sync.Mutex
	revoked map[[16]byte]time.Time // nonce → the session's expiry
}

func newSessions(tokens []string, ttl, idle time.Duration) *sessions {
	h := sha256.New()
	h.Write([]byte("locks-ui-session-v1"))
	sorted := slices.Clone(tokens)
	slices.Sort(sorted)
	for _, t := range sorted {
		h.Write([]byte{0})
		h.Write([]byte(t))
	}
	return &sessions{key: h.Sum(nil), tokens: tokens, ttl: ttl, idle: idle, revoked: map[[16]byte]time.Time{}}
}

// fingerprint names token in a cookie: keyed, so that a stolen cookie is no oracle to test
// token guesses against, and 128 bits long.
func (s *sessions) fingerprint(token string) []byte {
	return s.mac([]byte("locks-ui-token"), []byte(token))[:16]
}

func (s *sessions) mac(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// tokenValid reports whether t is one of the API tokens, in constant time per token.
func (s *sessions) tokenValid(t string) bool {
	ok := false
	for _, have := range s.tokens {
		if subtle.ConstantTimeCompare([]byte(have), []byte(t)) == 1 {
			ok = true
		}
	}
	return ok && t != ""
}

// issue makes the cookie of a new session for token (already checked); client says it is a
// client token.
func (s *sessions) issue(w http.ResponseWriter, r *http.Request, token string, client bool, now time.Time) {
	ses := session{expires: now.Add(s.ttl).Truncate(time.Second), active: now, token: token, client: client}
	_, _ = rand.Read(ses.nonce[:])
	s.write(w, r, ses, now)
}

// touch rewrites ses's cookie with now as its last use, when the cookie's is idleRefresh old.
func (s *sessions) touch(w http.ResponseWriter, r *http.Request, ses session, now time.Time) {
	if now.Sub(ses.active) < idleRefresh {
		return
	}
	ses.active = now
	s.write(w, r, ses, now)
}

func (s *sessions) write(w http.ResponseWriter, r *http.Request, ses session, now time.Time) {
	var body [cookieBodyLen]byte
	binary.BigEndian.PutUint64(body[:8], uint64(ses.expires.Unix()))
	copy(body[8:24], ses.nonce[:])
	copy(body[24:40], s.fingerprint(ses.token))
	binary.BigEndian.PutUint64(body[40:], uint64(ses.active.Unix()))
	all := body[:]
	if ses.client {
		all = s.seal(body[:], ses.token)
	}
	v := base64.RawURLEncoding.EncodeToString(all) + "." + base64.RawURLEncoding.EncodeToString(s.mac(all))
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: v, Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: isTLS(r), MaxAge: max(int(ses.expires.Sub(now).Seconds()), 1)})
}

// revoke ends ses on this process: its cookie is refused from now on.
func (s *sessions) revoke(ses session, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, exp := range s.revoked {
		if !now.Before(exp) {
			delete(s.revoked, n)
		}
	}
	for len(s.revoked) >= maxRevoked {
		var first [16]byte
		var at time.Time
		for n, exp := range s.revoked {
			if at.IsZero() || exp.Before(at) {
				first, at = n, exp
			}
		}
		delete(s.revoked, first)
	}
	s.revoked[ses.nonce] = ses.expires
}

func (s *sessions) isRevoked(nonce [16]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.revoked[nonce]
	return ok
}

func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: isTLS(r), MaxAge: -1})
}

func isTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// read is the request's session, or errNoSession.
func (s *sessions) read(r *http.Request, now time.Time) (session, error) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return session{}, errNoSession
	}
	b64, sig64, ok := strings.Cut(c.Value, ".")
	if !ok {
		return session{}, errNoSession
	}
	body, err1 := base64.RawURLEncoding.DecodeString(b64)
	sig, err2 := base64.RawURLEncoding.DecodeString(sig64)
	if err1 != nil || err2 != nil || len(body) < cookieBodyLen || len(body) > cookieBodyLen+maxSealedToken ||
		!hmac.Equal(sig, s.mac(body)) {
		return session{}, errNoSession
	}
	var ses session
	ses.expires = time.Unix(int64(binary.BigEndian.Uint64(body[:8])), 0)
	ses.active = time.Unix(int64(binary.BigEndian.Uint64(body[40:])), 0)
	if !now.Before(ses.expires) || (s.idle > 0 && now.Sub(ses.active) >= s.idle) {
		return session{}, errNoSession
	}
	copy(ses.nonce[:], body[8:24])
	if s.isRevoked(ses.nonce) {
		return session{}, errNoSession
	}
	if len(body) > cookieBodyLen {
		t, ok := s.open(body[:cookieBodyLen], body[cookieBodyLen:])
		if !ok || !hmac.Equal(s.fingerprint(t), body[24:40]) {
			return session{}, errNoSession
		}
		ses.token, ses.client = t, true
		return ses, nil
	}
	for _, t := range s.tokens {
		if hmac.Equal(s.fingerprint(t), body[24:40]) {
			ses.token = t
		}
	}
	if ses.token == "" {
		return session{}, errNoSession // its token was removed from LOCKS_API_TOKENS
	}
	return ses, nil
}

// csrf is the session's CSRF token: forms and htmx requests send it back with every POST,
// which a page of another site cannot read.
func (s *sessions) csrf(ses session) string {
	return base64.RawURLEncoding.EncodeToString(s.mac([]byte("csrf"), ses.nonce[:]))
}

func (s *sessions) csrfOK(r *http.Request, ses session) bool {
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && hmac.Equal([]byte(got), []byte(s.csrf(ses)))
}

// gcm is the AEAD that seals a client's token in its cookie.
func (s *sessions) gcm() cipher.AEAD {
	block, err := aes.NewCipher(s.mac([]byte("locks-ui-client-token-key")))
	if err != nil {
		panic(err) // a 32-byte key: cannot fail
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// seal is body followed by token sealed under a fresh nonce, body as associated data.
func (s *sessions) seal(body []byte, token string) []byte {
	aead := s.gcm()
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	out := append(slices.Clone(body), nonce...)
	return aead.Seal(out, nonce, []byte(token), body)
}

// open is the token sealed in sealed with body as associated data.
func (s *sessions) open(body, sealed []byte) (string, bool) {
	aead := s.gcm()
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return "", false
	}
	t, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], body)
	return string(t), err == nil && len(t) > 0
}
