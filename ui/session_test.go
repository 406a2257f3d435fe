package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A session cookie is accepted until it expires, by any instance with the same tokens, and
// refused when tampered with or when its token left LOCKS_API_TOKENS; its CSRF token is its own.
func TestSessionCookie(t *testing.T) {
	t.Parallel()
	const tok, other = "token-aaaaaaaaaaaaaaaa", "token-bbbbbbbbbbbbbbbb"
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := newSessions([]string{tok, other}, time.Hour)
	rec := httptest.NewRecorder()
	s.issue(rec, httptest.NewRequest("POST", "/ui/login", nil), other, now)
	c := rec.Result().Cookies()[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui/" || strings.Contains(c.Value, other) {
		t.Fatalf("cookie = %+v", c)
	}
	req := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.AddCookie(&http.Cookie{Name: cookieName, Value: v})
		return r
	}
	ses, err := s.read(req(c.Value), now.Add(59*time.Minute))
	if err != nil || ses.token != other {
		t.Fatalf("fresh session: %v, token %q", err, ses.token)
	}
	// Another instance (or a restart) with the same tokens, listed in another order.
	if _, err := newSessions([]string{other, tok}, time.Hour).read(req(c.Value), now); err != nil {
		t.Errorf("another instance refused the session: %v", err)
	}
	if _, err := s.read(req(c.Value), now.Add(time.Hour)); err == nil {
		t.Error("an expired session was accepted")
	}
	if _, err := newSessions([]string{tok}, time.Hour).read(req(c.Value), now); err == nil {
		t.Error("a session of a token no longer configured was accepted")
	}
	b := []byte(c.Value)
	b[3] ^= 1
	if _, err := s.read(req(string(b)), now); err == nil {
		t.Error("a tampered cookie was accepted")
	}
	rec2 := httptest.NewRecorder()
	s.issue(rec2, httptest.NewRequest("POST", "/ui/login", nil), other, now)
	ses2, _ := s.read(req(rec2.Result().Cookies()[0].Value), now)
	if s.csrf(ses) == s.csrf(ses2) {
		t.Error("two sessions share a CSRF token")
	}
	if !s.tokenValid(tok) || s.tokenValid("") || s.tokenValid(tok+"x") {
		t.Error("tokenValid")
	}
}
