package ui

import (
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
	"time"
)

// Sessions are stateless: the cookie holds an expiry, a random nonce and a fingerprint of the
// token signed in with, sealed with an HMAC whose key is derived from all the API tokens. So a
// session survives an API restart and works on every API instance with the same
// LOCKS_API_TOKENS, and dropping a token from LOCKS_API_TOKENS ends its sessions at once.
// The token itself never leaves the server. Logout clears the cookie; a copied cookie stays
// valid until it expires (SessionTTL), as nothing is stored to revoke it.

const (
	cookieName = "locks_session"
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

var errNoSession = errors.New("no valid session")

type session struct {
	expires time.Time
	nonce   [16]byte
	token   string // the API token the session signed in with
}

type sessions struct {
	key    []byte
	tokens []string
	ttl    time.Duration
}

func newSessions(tokens []string, ttl time.Duration) *sessions {
	h := sha256.New()
	h.Write([]byte("locks-ui-session-v1"))
	sorted := slices.Clone(tokens)
	slices.Sort(sorted)
	for _, t := range sorted {
		h.Write([]byte{0})
		h.Write([]byte(t))
	}
	return &sessions{key: h.Sum(nil), tokens: tokens, ttl: ttl}
}

func fingerprint(token string) []byte {
	s := sha256.Sum256([]byte("locks-ui-token\x00" + token))
	return s[:8]
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

// issue makes the cookie of a new session for token (already checked).
func (s *sessions) issue(w http.ResponseWriter, r *http.Request, token string, now time.Time) {
	var body [8 + 16 + 8]byte
	binary.BigEndian.PutUint64(body[:8], uint64(now.Add(s.ttl).Unix()))
	_, _ = rand.Read(body[8:24])
	copy(body[24:], fingerprint(token))
	v := base64.RawURLEncoding.EncodeToString(body[:]) + "." + base64.RawURLEncoding.EncodeToString(s.mac(body[:]))
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: v, Path: "/ui/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: isTLS(r), MaxAge: int(s.ttl.Seconds())})
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
	if err1 != nil || err2 != nil || len(body) != 32 || !hmac.Equal(sig, s.mac(body)) {
		return session{}, errNoSession
	}
	var ses session
	ses.expires = time.Unix(int64(binary.BigEndian.Uint64(body[:8])), 0)
	if !now.Before(ses.expires) {
		return session{}, errNoSession
	}
	copy(ses.nonce[:], body[8:24])
	for _, t := range s.tokens {
		if hmac.Equal(fingerprint(t), body[24:]) {
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
