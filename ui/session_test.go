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
	s := newSessions([]string{tok, other}, time.Hour, 0)
	rec := httptest.NewRecorder()
	s.issue(rec, httptest.NewRequest("POST", "/ui/login", nil), other, false, now)
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
	if _, err := newSessions([]string{other, tok}, time.Hour, 0).read(req(c.Value), now); err != nil {
		t.Errorf("another instance refused the session: %v", err)
	}
	if _, err := s.read(req(c.Value), now.Add(time.Hour)); err == nil {
		t.Error("an expired session was accepted")
	}
	if _, err := newSessions([]string{tok}, time.Hour, 0).read(req(c.Value), now); err == nil {
		t.Error("a session of a token no longer configured was accepted")
	}
	b := []byte(c.Value)
	b[3] ^= 1
	if _, err := s.read(req(string(b)), now); err == nil {
		t.Error("a tampered cookie was accepted")
	}
	rec2 := httptest.NewRecorder()
	s.issue(rec2, httptest.NewRequest("POST", "/ui/login", nil), other, false, now)
	ses2, _ := s.read(req(rec2.Result().Cookies()[0].Value), now)
	if s.csrf(ses) == s.csrf(ses2) {
		t.Error("two sessions share a CSRF token")
	}
	if !s.tokenValid(tok) || s.tokenValid("") || s.tokenValid(tok+"x") {
		t.Error("tokenValid")
	}
}

// Issue 25, item 10: a session unused for the idle timeout ends, each use keeps it alive
// (the cookie is rewritten), and the cookie's token fingerprint is keyed: the same token
// gives another fingerprint under another set of tokens.
func TestSessionIdleTimeout(t *testing.T) {
	t.Parallel()
	const tok = "token-aaaaaaaaaaaaaaaa"
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := newSessions([]string{tok}, 12*time.Hour, 30*time.Minute)
	cookie := func(rec *httptest.ResponseRecorder) string {
		cs := rec.Result().Cookies()
		if len(cs) == 0 {
			return ""
		}
		return cs[len(cs)-1].Value
	}
	req := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.AddCookie(&http.Cookie{Name: cookieName, Value: v})
		return r
	}
	rec := httptest.NewRecorder()
	s.issue(rec, httptest.NewRequest("POST", "/ui/login", nil), tok, false, now)
	first := cookie(rec)
	if _, err := s.read(req(first), now.Add(31*time.Minute)); err == nil {
		t.Fatal("a session unused for 31 minutes was accepted (idle timeout 30)")
	}
	// Used at 20 minutes: the cookie is rewritten, and lives 30 minutes from then.
	ses, err := s.read(req(first), now.Add(20*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	s.touch(rec, req(first), ses, now.Add(20*time.Minute))
	second := cookie(rec)
	if second == "" || second == first {
		t.Fatal("a use did not rewrite the cookie's last use")
	}
	if _, err := s.read(req(second), now.Add(49*time.Minute)); err != nil {
		t.Fatalf("a session used 29 minutes ago was refused: %v", err)
	}
	if _, err := s.read(req(second), now.Add(51*time.Minute)); err == nil {
		t.Fatal("a session unused for 31 minutes was accepted")
	}
	if string(s.fingerprint(tok)) == string(newSessions([]string{tok, "token-bbbbbbbbbbbbbbbb"}, time.Hour, 0).fingerprint(tok)) {
		t.Fatal("the token fingerprint is not keyed")
	}
}

// Issue 25, item 10: logout revokes the session: its cookie, replayed, no longer opens the
// dashboard, while another session of the same token still does.
func TestLogoutRevokes(t *testing.T) {
	t.Parallel()
	const token = "ui-token-0123456789abcdef"
	u, _, _ := newSigninUI(t, token)
	login := func() *http.Cookie {
		w := signin(u, "198.51.100.2:50000", token)
		if w.Code != http.StatusSeeOther {
			t.Fatalf("sign-in: %d", w.Code)
		}
		return w.Result().Cookies()[0]
	}
	get := func(c *http.Cookie) int {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.AddCookie(c)
		w := httptest.NewRecorder()
		u.Handler().ServeHTTP(w, r)
		return w.Code
	}
	c, other := login(), login()
	if code := get(c); code != http.StatusOK {
		t.Fatalf("signed in: GET /ui/ %d", code)
	}
	ses, err := u.sessions.read(func() *http.Request {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.AddCookie(c)
		return r
	}(), u.now())
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/ui/logout", strings.NewReader("csrf="+u.sessions.csrf(ses)))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.AddCookie(c)
	w := httptest.NewRecorder()
	u.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusSeeOther {
		t.Fatalf("logout: %d", w.Code)
	}
	if code := get(c); code != http.StatusSeeOther {
		t.Fatalf("the logged-out cookie replayed: GET /ui/ %d, want 303 to the sign-in", code)
	}
	if code := get(other); code != http.StatusOK {
		t.Fatalf("another session of the same token: GET /ui/ %d", code)
	}
}

// A client's session carries its client token sealed: the cookie does not show it, reads
// back to it on another instance with the same administrator tokens, and is refused when
// tampered with or when the administrator tokens (the sessions' key) change.
func TestClientSessionCookie(t *testing.T) {
	t.Parallel()
	const admin, client = "token-aaaaaaaaaaaaaaaa", "lsct_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	now := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	s := newSessions([]string{admin}, time.Hour, 0)
	rec := httptest.NewRecorder()
	s.issue(rec, httptest.NewRequest("POST", "/ui/login", nil), client, true, now)
	c := rec.Result().Cookies()[0]
	if strings.Contains(c.Value, client) || strings.Contains(c.Value, "lsct_") {
		t.Fatalf("the cookie shows the client token: %s", c.Value)
	}
	req := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/ui/", nil)
		r.AddCookie(&http.Cookie{Name: cookieName, Value: v})
		return r
	}
	ses, err := newSessions([]string{admin}, time.Hour, 0).read(req(c.Value), now)
	if err != nil || ses.token != client || !ses.client {
		t.Fatalf("client session: %v, token %q, client %v", err, ses.token, ses.client)
	}
	for _, i := range []int{3, len(c.Value) / 2, len(c.Value) - 50} {
		b := []byte(c.Value)
		b[i] ^= 1
		if _, err := s.read(req(string(b)), now); err == nil {
			t.Errorf("a cookie tampered at %d was accepted", i)
		}
	}
	if _, err := newSessions([]string{"token-cccccccccccccccc"}, time.Hour, 0).read(req(c.Value), now); err == nil {
		t.Error("a client session outlived a change of LOCKS_API_TOKENS")
	}
	// An administrator's cookie never reads as a client's, nor the reverse.
	rec = httptest.NewRecorder()
	s.issue(rec, httptest.NewRequest("POST", "/ui/login", nil), admin, false, now)
	if ses, err := s.read(req(rec.Result().Cookies()[0].Value), now); err != nil || ses.client || ses.token != admin {
		t.Fatalf("administrator session: %v %+v", err, ses)
	}
}
