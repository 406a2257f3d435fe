// Package procs is the process registry and the log stream: each `locks` process keeps a key
// in the KV bucket `processes` saying which parts it runs (refreshed every 5 s, deleted on a
// clean stop), and tees its warnings and errors to the stream LOGS, so that the dashboard
// and the alerts see every process without reaching each one.
package procs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lock-sensors/lock-sensors/internal/backoff"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/part"
)

// Info is a process's registry value, as JSON.
type Info struct {
	ID        string    `json:"id"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Parts     []string  `json:"parts"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	HTTPAddr  string    `json:"http_addr"`
}

// StaleAfter is the age of updated_at past which a process has stopped reporting.
const StaleAfter = 15 * time.Second

// Stale says the process has not refreshed its key within StaleAfter of now.
func (i Info) Stale(now time.Time) bool { return now.Sub(i.UpdatedAt) > StaleAfter }

var notKeyChar = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// NewID is a process id `<host>-<pid>-<8 hex random>`, usable as a KV key and a subject token.
func NewID(host string, pid int) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return notKeyChar.ReplaceAllString(host+"-"+strconv.Itoa(pid)+"-"+hex.EncodeToString(b[:]), "_")
}

// IntervalDefault is how often a process refreshes its key.
const IntervalDefault = 5 * time.Second

// Config describes the process being registered.
type Config struct {
	ID string // NewID; required
	// Part prefixes the registry key (natsx.ProcessKey, natsx.ProcessPart); "" keeps the
	// bare id, which only a user allowed everything may write.
	Part     string
	Parts    []string
	Version  string
	HTTPAddr string
	Interval time.Duration
}

func (c *Config) setDefaults() {
	if c.Interval <= 0 {
		c.Interval = IntervalDefault
	}
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	if c.ID == "" || notKeyChar.MatchString(c.ID) {
		return fmt.Errorf("procs: process id %q must be non-empty and of [A-Za-z0-9_-]", c.ID)
	}
	return nil
}

// Deps of the registry.
type Deps struct {
	Logger *slog.Logger
	JS     jetstream.JetStream
}

// Registry keeps this process's key in the processes bucket while it runs.
type Registry struct {
	cfg  Config
	js   jetstream.JetStream
	log  *slog.Logger
	info Info
}

// New is the registry of the process cfg describes.
func New(cfg Config, d Deps) (*Registry, error) {
	if err := part.Require("procs", part.Dep{Name: "Logger", Value: d.Logger}, part.Dep{Name: "JS", Value: d.JS}); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	info := Info{ID: cfg.ID, Host: host, PID: os.Getpid(), Parts: slices.Clone(cfg.Parts), Version: cfg.Version,
		StartedAt: time.Now().UTC(), HTTPAddr: cfg.HTTPAddr}
	return &Registry{cfg: cfg, js: d.JS, log: d.Logger.With("part", "procs"), info: info}, nil
}

// Run writes the key now and every Interval until ctx ends, then deletes it: a deleted key
// is a clean stop, a key left to go stale is a process that died.
func (r *Registry) Run(ctx context.Context) error {
	var kv jetstream.KeyValue
	failing := false
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		err := r.put(ctx, &kv)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			// Logged once per outage: the registry is best effort, NATS being away is logged elsewhere.
			r.log.Warn("process registry: cannot write this process's key", "err", err)
			failing = true
		case err == nil && failing:
			r.log.Info("process registry: key written again")
			failing = false
		}
		select {
		case <-ctx.Done():
			r.remove(kv)
			return nil
		case <-t.C:
		}
	}
}

func (r *Registry) put(ctx context.Context, kv *jetstream.KeyValue) error {
	c, cancel := context.WithTimeout(ctx, r.cfg.Interval)
	defer cancel()
	if *kv == nil {
		b, err := r.js.KeyValue(c, natsx.ProcessesBucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", natsx.ProcessesBucket, err)
		}
		*kv = b
	}
	info := r.info
	info.UpdatedAt = time.Now().UTC()
	v, err := json.Marshal(info)
	if err != nil {
		return err
	}
	_, err = (*kv).Put(c, r.key(), v)
	return err
}

// key is the process's registry key.
func (r *Registry) key() string {
	if r.cfg.Part == "" {
		return r.cfg.ID
	}
	return natsx.ProcessKey(r.cfg.Part, r.cfg.ID)
}

// remove deletes the key on a clean stop, within a short bound of its own: ctx is done.
func (r *Registry) remove(kv jetstream.KeyValue) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if kv == nil {
		var err error
		if kv, err = r.js.KeyValue(c, natsx.ProcessesBucket); err != nil {
			return
		}
	}
	for attempt := 1; ; attempt++ {
		err := kv.Delete(c, r.key())
		if err == nil {
			return
		}
		if !backoff.Sleep(c, backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}.Next(attempt)) {
			r.log.Warn("process registry: cannot delete this process's key; it will show as stopped reporting", "err", err)
			return
		}
	}
}

// keyMatches says the entry under key may say what i says: a key "<part>.<id>" holds process
// id running part alone (a part's NATS user may write only its part's keys, so it cannot
// speak for another part's processes); "all.<id>" and a bare id are written by a user allowed
// everything.
func keyMatches(key string, i Info) bool {
	part, id, ok := strings.Cut(key, ".")
	if !ok {
		return key == i.ID
	}
	if id != i.ID {
		return false
	}
	return part == natsx.ProcessAll || len(i.Parts) == 1 && i.Parts[0] == part
}

// List reads the processes registered now (stale ones included: see Info.Stale), by id.
func List(ctx context.Context, js jetstream.JetStream) ([]Info, error) {
	kv, err := js.KeyValue(ctx, natsx.ProcessesBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", natsx.ProcessesBucket, err)
	}
	// One watcher gives every current value, then nil: no request per key.
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", natsx.ProcessesBucket, err)
	}
	defer func() { _ = w.Stop() }()
	var out []Info
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bucket %s: %w", natsx.ProcessesBucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok || e == nil {
				slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.ID, b.ID) })
				return out, nil
			}
			var i Info
			if json.Unmarshal(e.Value(), &i) != nil || !keyMatches(e.Key(), i) {
				continue // not ours, or forged: a part's user writes only its own part's keys
			}
			out = append(out, i)
		}
	}
}
