// Package ui is the admin dashboard served at /ui/ by the API process: server-rendered
// html/template pages whose panels htmx refreshes every few seconds, with htmx and the style
// sheet embedded in the binary (no frontend build). An operator signs in with one of the API
// tokens; the session is a sealed HttpOnly, SameSite=Strict cookie (session.go), and every
// POST carries the session's CSRF token. The panels read what the admin API serves (data.go),
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
}

// UI is the dashboard's HTTP handler.
type UI struct {
	cfg      Config
	log      *slog.Logger
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
		part.Dep{Name: "API", Value: d.API}, part.Dep{Name: "JS", Value: d.JS}); err != nil {
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
	u := &UI{cfg: cfg, log: d.Logger.With("part", "ui"), js: d.JS, api: newAPIClient(d.API),
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
	mux.HandleFunc("POST /ui/logout", u.post(u.logout))
	mux.HandleFunc("GET /ui/{$}", u.get(u.dashboard))
	mux.HandleFunc("GET /ui/panel/{name}", u.get(u.panel))
	mux.HandleFunc("POST /ui/resend", u.post(u.resend))
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

// get serves h to a signed-in operator and sends anyone else to the sign-in page (an htmx
// refresh is told to reload the whole page there).
func (u *UI) get(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		now := u.now()
		ses, err := u.sessions.read(r, now)
		if err != nil {
			if r.Header.Get("HX-Request") != "" {
				w.Header().Set("HX-Redirect", "/ui/login")
				http.Error(w, "sign in again", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
			return
		}
		u.sessions.touch(w, r, ses, now)
		h(w, r, ses)
	}
}

// post serves h only with a session and that session's CSRF token.
func (u *UI) post(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		now := u.now()
		ses, err := u.sessions.read(r, now)
		if err != nil {
			http.Error(w, "not signed in", http.StatusUnauthorized)
			return
		}
		if !u.sessions.csrfOK(r, ses) {
			u.log.Warn("dashboard POST refused: missing or wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
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
	if !u.sessions.tokenValid(token) {
		u.signins.WithLabelValues("refused").Inc()
		u.guard.failed(addr, now)
		u.render(w, http.StatusUnauthorized, "login.html", map[string]any{"Error": "That is not one of the API tokens (LOCKS_API_TOKENS)."})
		return
	}
	u.guard.succeeded(addr)
	u.signins.WithLabelValues("ok").Inc()
	u.sessions.issue(w, r, token, u.now())
	http.Redirect(w, r, "/ui/", http.StatusSeeOther)
}

func (u *UI) logout(w http.ResponseWriter, r *http.Request, ses session) {
	u.sessions.revoke(ses, u.now())
	clearCookie(w, r)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request, ses session) {
	u.render(w, http.StatusOK, "dashboard.html", map[string]any{
		"CSRF": u.sessions.csrf(ses), "Refresh": fmt.Sprintf("every %dms", u.cfg.Refresh.Milliseconds()),
	})
}
