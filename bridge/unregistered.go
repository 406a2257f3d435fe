package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The bound on unregistered sensors (docs/security.md, Unregistered sensors). Anyone who may
// publish to the queue can mint sensor ids, and each id tracked costs a sensor_state row, a
// liveness key and the watchdog's memory. The bridge is the one place every reading passes,
// one consumer at a time, so it decides once per reading whether the sensor is tracked and
// writes that decision into the reading itself (event.Log.Untracked): the state projector,
// the watchdog, every replay and every rebuild then follow the log, and all agree without
// asking anyone. The decision is decideTracking; the sensors type keeps what it decides from.

// tracking is what becomes of a valid reading.
type tracking int

const (
	// trackKnown: a registered sensor, or an unregistered one already tracked.
	trackKnown tracking = iota
	// trackNew: an unregistered sensor that takes one of the LOCKS_UNREGISTERED_MAX places.
	trackNew
	// trackNone: an unregistered sensor beyond the bound; appended, marked untracked.
	trackNone
	// trackRefuse: LOCKS_ACCEPT_UNREGISTERED=false; the reading goes to the invalid queue.
	trackRefuse
)

// decideTracking decides a reading's tracking: known says its sensor is registered or (when
// unregistered sensors are accepted) already tracked; places is how many more unregistered
// sensors may be tracked.
func decideTracking(known, accept bool, places int) tracking {
	switch {
	case known:
		return trackKnown
	case !accept:
		return trackRefuse
	case places > 0:
		return trackNew
	}
	return trackNone
}

// ReasonUnregistered is the invalid queue's reason for a reading of a sensor that is not
// registered while LOCKS_ACCEPT_UNREGISTERED is false.
const ReasonUnregistered = "unregistered"

// maxChecked bounds the ids remembered as looked up and found unregistered; beyond it the
// memory is emptied (only lookups are repeated, within their budget).
const maxChecked = 10_000

// recheckAfter is how long a sensor found unregistered is not looked up again: a flood of one
// id does not spend the budget others need, and a sensor registered meanwhile is tracked
// from its first reading this long after (or after the next refresh, if sooner).
const recheckAfter = 5 * time.Second

// lookupTimeout bounds one registry lookup of an unknown sensor, and lookupPause is how
// long lookups stop after one failed: the delivery loop waits for a lookup.
const (
	lookupTimeout = 500 * time.Millisecond
	lookupPause   = 10 * time.Second
)

// sensors is the bridge's view of the registry and of the unregistered sensors tracked: loaded
// at the start of every session (so a bridge taking over starts from what the state projection
// holds), refreshed every RegistryRefresh, and asked once per reading.
//
// A sensor registered since the last refresh is looked up in Postgres when its reading would
// otherwise be refused or untracked, within LookupsPerSecond, so that a flood of minted ids
// cannot turn into a flood of queries; the refresh catches the rest.
type sensors struct {
	pg     *pgxpool.Pool
	log    *slog.Logger
	max    int
	accept bool
	budget int

	mu         sync.Mutex
	registered map[string]struct{}
	// unreg are the unregistered sensors tracked: those with a sensor_state row at load, and
	// those decided trackNew since.
	unreg map[string]struct{}
	// since is the database's time of the last registry read.
	since time.Time
	// checked are ids looked up and found unregistered, with when.
	checked map[string]time.Time
	// window and lookups count the lookups of the current second; none before pausedUntil.
	window      time.Time
	lookups     int
	pausedUntil time.Time
	// lookupErrs counts the failed lookups since the last report, lookupErr the last one.
	lookupErrs int
	lookupErr  error
	// untracked and refused count readings since the last report; sample is one of their ids.
	untracked, refused int
	sample             string
	// reported is when report last logged; period how often it may.
	reported time.Time
	period   time.Duration

	mTracked   prometheus.Gauge
	mUntracked prometheus.Counter
}

func newSensors(cfg Config, pg *pgxpool.Pool, log *slog.Logger, reg prometheus.Registerer) (*sensors, error) {
	s := &sensors{pg: pg, log: log, max: max(cfg.UnregisteredMax, 0), accept: !cfg.RefuseUnregistered, budget: cfg.LookupsPerSecond,
		period:     cfg.RegistryRefresh,
		registered: map[string]struct{}{}, unreg: map[string]struct{}{}, checked: map[string]time.Time{},
		mTracked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "locks_unregistered_tracked",
			Help: "Unregistered sensors tracked (state, liveness key), at most locks_unregistered_max.",
		}),
		mUntracked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "locks_unregistered_untracked_readings_total",
			Help: "Readings of unregistered sensors beyond LOCKS_UNREGISTERED_MAX: appended to READINGS, not tracked.",
		}),
	}
	maxGauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "locks_unregistered_max",
		Help: "LOCKS_UNREGISTERED_MAX: the most unregistered sensors tracked (0 while LOCKS_ACCEPT_UNREGISTERED=false).",
	})
	if s.accept {
		maxGauge.Set(float64(s.max))
	}
	for _, c := range []prometheus.Collector{s.mTracked, s.mUntracked, maxGauge} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("bridge metrics: %w", err)
		}
	}
	return s, nil
}

// load reads the registry and the unregistered sensors that have state, in one snapshot.
func (s *sensors) load(ctx context.Context) error {
	registered := make(map[string]struct{}, len(s.registered))
	unreg := map[string]struct{}{}
	var since time.Time
	err := pgx.BeginTxFunc(ctx, s.pg, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
			return err
		}
		if err := collectIDs(ctx, tx, `SELECT id FROM sensors`, registered); err != nil {
			return err
		}
		if !s.accept {
			return nil
		}
		return collectIDs(ctx, tx, `SELECT s.sensor_id FROM sensor_state s
			WHERE NOT EXISTS (SELECT 1 FROM sensors r WHERE r.id = s.sensor_id)`, unreg)
	})
	if err != nil {
		return fmt.Errorf("load the sensor registry: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered, s.unreg, s.checked, s.since = registered, unreg, map[string]time.Time{}, since
	s.mTracked.Set(float64(len(unreg)))
	if len(unreg) > s.max && s.accept {
		s.log.Warn("more unregistered sensors have state than LOCKS_UNREGISTERED_MAX; they stay tracked, no new one is",
			"tracked", len(unreg), "max", s.max)
	}
	return nil
}

// refreshSlack is how far back before the last read a refresh looks for registrations: a
// sensor's created_at is its transaction's start, which may commit a little later.
const refreshSlack = 5 * time.Minute

// refresh reads the sensors registered since the last read (with refreshSlack): each is
// tracked as registered from now on and gives its unregistered place back. A sensor deleted
// stays known as registered until the next session's load: it keeps being tracked.
func (s *sensors) refresh(ctx context.Context) error {
	var now time.Time
	if err := s.pg.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return fmt.Errorf("refresh the sensor registry: %w", err)
	}
	s.mu.Lock()
	since := s.since
	s.mu.Unlock()
	added := map[string]struct{}{}
	if err := collectIDs(ctx, s.pg, `SELECT id FROM sensors WHERE created_at >= $1`, added, since.Add(-refreshSlack)); err != nil {
		return fmt.Errorf("refresh the sensor registry: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since, s.checked = now, map[string]time.Time{}
	for id := range added {
		s.registered[id] = struct{}{}
		delete(s.unreg, id)
	}
	s.mTracked.Set(float64(len(s.unreg)))
	return nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func collectIDs(ctx context.Context, q querier, sql string, into map[string]struct{}, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var id string
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return err
		}
		into[id] = struct{}{}
	}
	return rows.Err()
}

// decide says what becomes of a reading of sensor id. It never fails: when the registry
// cannot be asked, the sensor is taken as unregistered (its reading is untracked or refused,
// and kept either way), lookups pause for lookupPause, and the failures are reported; a slow
// or unreachable Postgres must not hold up the queue.
func (s *sensors) decide(ctx context.Context, id string, now time.Time) tracking {
	s.mu.Lock()
	t := s.decideLocked(id)
	ask := false
	if t == trackNone || t == trackRefuse {
		at, seen := s.checked[id]
		ask = (!seen || now.Sub(at) >= recheckAfter) && s.spend(now)
	}
	s.mu.Unlock()
	if ask {
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		var found bool
		err := s.pg.QueryRow(lctx, `SELECT EXISTS (SELECT 1 FROM sensors WHERE id = $1)`, id).Scan(&found)
		cancel()
		s.mu.Lock()
		switch {
		case err != nil:
			s.pausedUntil = now.Add(lookupPause)
			s.lookupErrs++
			s.lookupErr = err
		case found:
			s.registered[id] = struct{}{}
			t = trackKnown
		default:
			if len(s.checked) >= maxChecked {
				clear(s.checked)
			}
			s.checked[id] = now
		}
		s.mu.Unlock()
	}
	if t == trackNone || t == trackRefuse {
		s.mu.Lock()
		if t == trackNone {
			s.untracked++
			s.mUntracked.Inc()
		} else {
			s.refused++
		}
		s.sample = id
		due := now.Sub(s.reported) >= s.period
		s.mu.Unlock()
		if due {
			s.report(now)
		}
	}
	return t
}

// decideLocked applies decideTracking to what is known of id, and takes a place for a new one.
func (s *sensors) decideLocked(id string) tracking {
	_, known := s.registered[id]
	if !known && s.accept {
		_, known = s.unreg[id]
	}
	t := decideTracking(known, s.accept, s.max-len(s.unreg))
	if t == trackNew {
		s.unreg[id] = struct{}{}
		s.mTracked.Set(float64(len(s.unreg)))
	}
	return t
}

// spend takes one lookup from the current second's budget.
func (s *sensors) spend(now time.Time) bool {
	if now.Before(s.pausedUntil) {
		return false
	}
	if now.Sub(s.window) >= time.Second {
		s.window, s.lookups = now, 0
	}
	if s.lookups >= s.budget {
		return false
	}
	s.lookups++
	return true
}

// report logs, in one line, the readings untracked or refused since the last report: the
// first at once, then one line per period at most, not one per reading, whatever a flood sends.
func (s *sensors) report(now time.Time) {
	s.mu.Lock()
	if s.untracked+s.refused+s.lookupErrs > 0 {
		s.reported = now
	}
	untracked, refused, sample, tracked := s.untracked, s.refused, s.sample, len(s.unreg)
	lookupErrs, lookupErr := s.lookupErrs, s.lookupErr
	s.untracked, s.refused, s.sample, s.lookupErrs, s.lookupErr = 0, 0, "", 0, nil
	s.mu.Unlock()
	if lookupErrs > 0 {
		s.log.Warn("registry lookups failed; sensors not known to be registered were taken as unregistered meanwhile",
			"failures", lookupErrs, "err", lookupErr)
	}
	if untracked > 0 {
		s.log.Warn("readings of unregistered sensors beyond LOCKS_UNREGISTERED_MAX were recorded but not tracked",
			"readings", untracked, "sensor_id", sample, "tracked_unregistered", tracked, "max", s.max)
	}
	if refused > 0 {
		s.log.Warn("readings of unregistered sensors were refused (LOCKS_ACCEPT_UNREGISTERED=false) and moved to the invalid queue",
			"readings", refused, "sensor_id", sample)
	}
}

// keepFresh refreshes the registry and reports every period until ctx ends; what is left
// unreported then is reported by the next session's first report.
func (s *sensors) keepFresh(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("registry refresh failed; the last one is used", "err", err)
			}
			s.report(now)
		}
	}
}
