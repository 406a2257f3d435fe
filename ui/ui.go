// Package ui is the admin dashboard served at /ui/ by the API process: server-rendered
// html/template pages whose panels htmx refreshes every few seconds, with htmx and the style
// sheet embedded in the binary (no frontend build). An operator signs in with one of the API
// tokens; the session is a sealed HttpOnly, SameSite=Strict cookie (session.go), and every
// POST carries the session's CSRF token. A client's people sign in with a client token and
// see their client's page only (client.go); every other page and action answers them 403. The panels read what the admin API serves (data.go),
// the process registry and the LOGS stream (internal/procs).
package ui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/lock-sensors/lock-sensors/internal/part"
)

//go:embed static templates
var assets embed.FS

// Defaults of Config.
const (
	SessionTTLDefault = 12 * time.Hour
	// IdleTimeoutDefault ends a session unused this long (the panels' refreshes use it).
	IdleTimeoutDefault = 30 * time.Minute
	// RefreshDefault is how often the panels reload: the issue allows data at most 5 s old.
	RefreshDefault = 3 * time.Second
)

// Config is the dashboard's part of the configuration.
type Config struct {
	// Tokens are the API tokens (LOCKS_API_TOKENS) an operator signs in with.
	Tokens []string
	// SessionTTL is how long a sign-in lasts.
	SessionTTL time.Duration
	// IdleTimeout ends a session unused this long.
	IdleTimeout time.Duration
	// Refresh is the panels' polling period, at most 5 s.
	Refresh time.Duration
}

func (c *Config) setDefaults() {
	if c.SessionTTL <= 0 {
		c.SessionTTL = SessionTTLDefault
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = IdleTimeoutDefault
	}
	if c.Refresh <= 0 {
		c.Refresh = RefreshDefault
	}
}

// Validate reports the first wrong field.
func (c Config) Validate() error {
	if c.Refresh > 5*time.Second {
		return fmt.Errorf("ui: refresh %s is above 5s", c.Refresh)
	}
	return nil
}

// Deps are what the dashboard is built from.
type Deps struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// API is the admin API's in-process connection (api.Server.InProcess).
	API grpc.ClientConnInterface
	// JS is where the process registry and LOGS are read.
	JS jetstream.JetStream
	// ClientTokens says whose a client token is (api.Server).
	ClientTokens ClientTokens
}

// UI is the dashboard's HTTP handler.
type UI struct {
	cfg      Config
	log      *slog.Logger
	tokens   ClientTokens
	js       jetstream.JetStream
	api      *apiClient
	sessions *sessions
	rates    *rateMeter
	pages    *template.Template
	handler  http.Handler
	signins  *prometheus.CounterVec
	guard    *signinGuard
	panels   *panelCache
	now      func() time.Time
}

// New builds the dashboard; mount Handler on "/ui/".
func New(cfg Config, d Deps) (*UI, error) {
	if err := part.Require("ui", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "Registerer", Value: d.Registerer},
		part.Dep{Name: "API", Value: d.API}, part.Dep{Name: "JS", Value: d.JS},
		part.Dep{Name: "ClientTokens", Value: d.ClientTokens}); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("ui: templates: %w", err)
	}
	u := &UI{cfg: cfg, log: d.Logger.With("part", "ui"), js: d.JS, tokens: d.ClientTokens, api: newAPIClient(d.API),
		sessions: newSessions(cfg.Tokens, cfg.SessionTTL, cfg.IdleTimeout), rates: newRateMeter(), pages: pages, now: time.Now,
		guard: newSigninGuard(d.Logger.With("part", "ui")), panels: newPanelCache(),
		signins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "locks_ui_signins_total", Help: "Dashboard sign-in attempts, by result (ok, refused, throttled).",
		}, []string{"result"})}
	if err := d.Registerer.Register(u.signins); err != nil {
		return nil, fmt.Errorf("ui: metrics: %w", err)
	}
	static, _ := fs.Sub(assets, "static")
	mux := http.NewServeMux()
	mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /ui/login", u.loginPage)
	mux.HandleFunc("POST /ui/login", u.login)
	// get and post serve administrators only; a client session gets 403 there, so that a
	// page added later is closed to clients unless it says otherwise (getAs, postAs).
	mux.HandleFunc("POST /ui/logout", u.postAs(anyone, u.logout))
	mux.HandleFunc("GET /ui/{$}", u.getAs(anyone, u.home))
	mux.HandleFunc("GET /ui/panel/{name}", u.get(u.panel))
	mux.HandleFunc("GET /ui/client/panel/{name}", u.getAs(clientOnly, u.clientPanel))
	mux.HandleFunc("POST /ui/resend", u.post(u.resend))
	mux.HandleFunc("POST /ui/client/resend", u.postAs(clientOnly, u.clientResend))
	mux.HandleFunc("POST /ui/client/test-event", u.postAs(clientOnly, u.testEvent))
	mux.HandleFunc("POST /ui/client/rotate-secret", u.postAs(clientOnly, u.rotateSecret))
	mux.HandleFunc("POST /ui/enable", u.post(u.enable))
	mux.HandleFunc("POST /ui/rebuild", u.post(u.rebuild))
	u.handler = secure(mux)
	return u, nil
}

// Handler serves everything under /ui/.
func (u *UI) Handler() http.Handler { return u.handler }

// secure adds the headers that keep the pages out of frames and scripts to our own files.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "same-origin")
		w.Header().Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

type handler func(w http.ResponseWriter, r *http.Request, ses session)

// who may use a page or an action.
type who int

const (
	adminOnly  who = iota // sessions of an administrator token
	clientOnly            // sessions of a client token
	anyone                // either; the handler tells them apart
)

// get serves h to a signed-in operator (administrator) only.
func (u *UI) get(h handler) http.HandlerFunc { return u.getAs(adminOnly, h) }

// post serves h to a signed-in operator (administrator) only, with the CSRF token.
func (u *UI) post(h handler) http.HandlerFunc { return u.postAs(adminOnly, h) }

// session is the request's session; a client's session with its client looked up, so that a
// deleted client token ends its sessions at once.
func (u *UI) session(r *http.Request, now time.Time) (session, error) {
	ses, err := u.sessions.read(r, now)
	if err != nil || !ses.client {
		return ses, err
	}
	ses.clientID, err = u.tokens.ClientOfToken(r.Context(), ses.token)
	if err != nil {
		u.log.Info("dashboard: a client session's token is refused", "err", err)
		return session{}, errNoSession
	}
	return ses, nil
}

// allowed says whether ses may use a page for w; if not it answers 403.
func (u *UI) allowed(w http.ResponseWriter, r *http.Request, ses session, w2 who) bool {
	switch {
	case w2 == anyone, w2 == adminOnly && !ses.client, w2 == clientOnly && ses.client:
		return true
	case ses.client:
		u.log.Warn("dashboard: a client session refused an administrator's page", "path", r.URL.Path, "client_id", ses.clientID)
		http.Error(w, "403 forbidden: this page is the administrator's; a client token opens its own client's page only (/ui/)", http.StatusForbidden)
	default:
		http.Error(w, "403 forbidden: this page is a client's; sign in with that client's token", http.StatusForbidden)
	}
	return false
}

// getAs serves h to a signed-in w and sends anyone not signed in to the sign-in page (an
// htmx refresh is told to reload the whole page there).
func (u *UI) getAs(w2 who, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		now := u.now()
		ses, err := u.session(r, now)
		if err != nil {
			if r.Header.Get("HX-Request") != "" {
				w.Header().Set("HX-Redirect", "/ui/login")
				http.Error(w, "sign in again", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
			return
		}
		if !u.allowed(w, r, ses, w2) {
			return
		}
		u.sessions.touch(w, r, ses, now)
		h(w, r, ses)
	}
}

// postAs serves h only to w's session with that session's CSRF token.
func (u *UI) postAs(w2 who, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		now := u.now()
		ses, err := u.session(r, now)
		if err != nil {
			http.Error(w, "not signed in", http.StatusUnauthorized)
			return
		}
		if !u.sessions.csrfOK(r, ses) {
			u.log.Warn("dashboard POST refused: missing or wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
			return
		}
		if !u.allowed(w, r, ses, w2) {
			return
		}
		u.sessions.touch(w, r, ses, now)
		h(w, r, ses)
	}
}

func (u *UI) render(w http.ResponseWriter, status int, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := u.pages.ExecuteTemplate(w, name, data); err != nil && !errors.Is(err, context.Canceled) {
		u.log.Warn("dashboard: rendering failed", "template", name, "err", err)
	}
}

func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	u.render(w, http.StatusOK, "login.html", map[string]any{"Error": ""})
}

func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	// A sign-in form posted from another site would sign the victim in as the attacker.
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		if ou, err := url.Parse(o); err != nil || ou.Host != r.Host {
			http.Error(w, "cross-origin sign-in refused", http.StatusForbidden)
			return
		}
	}
	addr, now := clientAddr(r), u.now()
	if wait := u.guard.wait(addr, now); wait > 0 {
		// Too early after wrong tokens: not even read, so guessing is no faster for trying.
		u.signins.WithLabelValues("throttled").Inc()
		secs := int(wait.Round(time.Second) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
		u.render(w, http.StatusTooManyRequests, "login.html", map[string]any{
			"Error": fmt.Sprintf("Too many wrong tokens from your address: try again in %d s.", max(secs, 1))})
		return
	}
	token := r.PostFormValue("token")
	client := false
	if !u.sessions.tokenValid(token) {
		if _, err := u.tokens.ClientOfToken(r.Context(), token); err != nil {
			u.signins.WithLabelValues("refused").Inc()
			u.guard.failed(addr, now)
			u.render(w, http.StatusUnauthorized, "login.html", map[string]any{
				"Error": "That is neither one of the API tokens (LOCKS_API_TOKENS) nor a client token."})
			return
		}
		client = true
	}
	u.guard.succeeded(addr)
	u.signins.WithLabelValues("ok").Inc()
	u.sessions.issue(w, r, token, client, u.now())
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request, ses session) {
	u.sessions.revoke(ses, u.now())
	clearCookie(w, r)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// home is the administrator's dashboard, or a client's own page.
func (u *UI) home(w http.ResponseWriter, r *http.Request, ses session) {
	if ses.client {
		u.clientPage(w, r, ses)
		return
	}
	u.dashboard(w, r, ses)
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request, ses session) {
	u.render(w, http.StatusOK, "dashboard.html", map[string]any{
		"CSRF": u.sessions.csrf(ses), "Refresh": fmt.Sprintf("every %dms", u.cfg.Refresh.Milliseconds()),
	})
}
