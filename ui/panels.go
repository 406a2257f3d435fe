package ui

import (
	"context"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"github.com/lock-sensors/lock-sensors/internal/procs"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// panelTimeout bounds one panel's reads, well within the refresh period's tolerance.
const panelTimeout = 4 * time.Second

// logsShown is how many of the newest warnings and errors the log panel shows.
const logsShown = 500

var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return time.Since(t).Truncate(time.Second).String() + " ago"
	},
	"ts":   func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"tsn":  func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"rate": func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"pct": func(done, total uint64) string {
		if total == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f%%", 100*float64(done)/float64(total))
	},
	"stale": func(p procs.Info) bool { return p.Stale(time.Now()) },
	// sent says which channels accepted the notices of an alert's event ("firing", "resolved").
	"sent": func(a *locksv1.Alert, event string) string {
		var out []string
		for _, n := range a.GetNotices() {
			if n.GetEvent() != event {
				continue
			}
			if n.GetSentTime() != nil {
				out = append(out, n.GetChannel()+" sent")
			} else {
				out = append(out, fmt.Sprintf("%s waiting (%d attempts)", n.GetChannel(), n.GetAttempts()))
			}
		}
		if len(out) == 0 {
			return "no channel configured"
		}
		return strings.Join(out, ", ")
	},
	"phase": func(p locksv1.RebuildPhase) string { return p.String()[len("REBUILD_PHASE_"):] },
}

// panels are the panels' names.
var panels = map[string]bool{"overview": true, "lost": true, "clients": true, "dead": true, "setaside": true,
	"rebuilds": true, "alerts": true, "processes": true, "logs": true}

// panel renders one panel's body: what htmx swaps in every Refresh. Every viewer is an
// administrator and sees the same data, so a panel's data is read once per Refresh for all
// open tabs (panelCache), not once per tab: ten tabs cost the database what one does.
func (u *UI) panel(w http.ResponseWriter, r *http.Request, ses session) {
	name := r.PathValue("name")
	if !panels[name] {
		http.NotFound(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(as(r.Context(), ses), panelTimeout)
	defer cancel()
	q := r.URL.Query().Get("q")
	load := func(ctx context.Context) (map[string]any, error) { return u.loadPanel(ctx, name, q) }
	var shared map[string]any
	var err error
	if name == "lost" && q != "" {
		shared, err = load(ctx) // a search: its own query, as the operator types it
	} else {
		// Half a refresh: a tab sees data at most one and a half refreshes old (a lost
		// sensor shows within lost_after plus that), and a panel is still read at most twice
		// a refresh whatever the number of tabs.
		shared, err = u.panels.get(ctx, name, u.cfg.Refresh/2, load)
	}
	data := maps.Clone(shared)
	if data == nil {
		data = map[string]any{}
	}
	data["Now"], data["CSRF"] = u.now(), u.sessions.csrf(ses)
	if err != nil {
		data["Error"] = errText(err)
	}
	u.render(w, http.StatusOK, "panel-"+name, data)
}

// loadPanel reads what panel name shows.
func (u *UI) loadPanel(ctx context.Context, name, q string) (map[string]any, error) {
	data := map[string]any{}
	var err error
	switch name {
	case "overview":
		var ps []procs.Info
		ps, err = procs.List(ctx, u.js)
		data["Rates"] = u.rates.read(ctx, ps, u.now())
		if err == nil {
			data["Counts"], err = u.api.sensorCounts(ctx)
		}
		if err == nil {
			var res *locksv1.ListProjectionsResponse
			res, err = u.api.projs.ListProjections(ctx, &locksv1.ListProjectionsRequest{})
			data["Projections"] = res.GetProjections()
		}
	case "lost":
		data["Q"] = q
		data["Lost"], data["Capped"], err = u.api.lostSensors(ctx, q)
	case "clients":
		var cs []*locksv1.Client
		cs, err = u.api.listClients(ctx)
		data["More"] = len(cs) > clientsShown
		cs = cs[:min(len(cs), clientsShown)]
		stats := make([]clientStat, 0, len(cs))
		for _, c := range cs {
			stats = append(stats, u.api.clientStat(ctx, c))
		}
		data["Clients"], data["Shown"] = stats, clientsShown
	case "dead":
		data["Dead"], err = u.deadRows(ctx)
	case "setaside":
		var res *locksv1.ListSetAsideResponse
		res, err = u.api.setAside.ListSetAside(ctx, &locksv1.ListSetAsideRequest{PageSize: 100})
		data["SetAside"], data["More"] = res.GetSetAside(), res.GetNextPageToken() != ""
	case "rebuilds":
		var res *locksv1.ListProjectionsResponse
		res, err = u.api.projs.ListProjections(ctx, &locksv1.ListProjectionsRequest{})
		data["Projections"] = res.GetProjections()
	case "alerts":
		data["Firing"], data["Resolved"], err = u.api.alertLists(ctx)
	case "processes":
		data["Processes"], err = procs.List(ctx, u.js)
	case "logs":
		var logs []procs.LogRecord
		logs, err = procs.LastLogs(ctx, u.js, logsShown)
		slices.Reverse(logs)
		data["Logs"] = logs
	}
	return data, err
}

type deadRow struct {
	ClientID, ClientName string
	*locksv1.DeadDelivery
	DeadTime time.Time
}

// deadRows reads every client's dead deliveries in one paged call (newest first), and the
// clients' names once: its cost does not grow with the number of clients.
func (u *UI) deadRows(ctx context.Context) ([]deadRow, error) {
	dead, err := u.api.deadLetters(ctx, allClients)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	if len(dead) > 0 {
		cs, err := u.api.listClients(ctx)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			names[c.GetId()] = c.GetName()
		}
	}
	out := make([]deadRow, 0, len(dead))
	for _, d := range dead {
		out = append(out, deadRow{ClientID: d.GetClientId(), ClientName: names[d.GetClientId()], DeadDelivery: d, DeadTime: d.GetDeadTime().AsTime()})
	}
	slices.SortFunc(out, func(a, b deadRow) int { return b.DeadTime.Compare(a.DeadTime) })
	return out, nil
}

// allClients is the client id of ListClientDeliveries that lists every client's dead
// deliveries.
const allClients = "-"

func errText(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// resend sends one dead letter again (the resend call for that delivery alone).
func (u *UI) resend(w http.ResponseWriter, r *http.Request, ses session) {
	client, evt := r.PostFormValue("client_id"), r.PostFormValue("event_id")
	if err := u.api.resend(as(r.Context(), ses), client, evt); err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.panels.reset()
	u.log.Info("dashboard: dead letter resent", "client_id", client, "event_id", evt)
	u.render(w, http.StatusOK, "result", map[string]any{"Msg": evt + " sent again to " + client})
}

// enable re-enables a disabled endpoint (the operator says it is fixed): its waiting
// deliveries go out, and every notifier closes the client's circuit breaker.
func (u *UI) enable(w http.ResponseWriter, r *http.Request, ses session) {
	client := r.PostFormValue("client_id")
	c, err := u.api.enable(as(r.Context(), ses), client)
	if err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.panels.reset()
	u.log.Info("dashboard: endpoint re-enabled", "client_id", client)
	u.render(w, http.StatusOK, "result", map[string]any{"Msg": c.GetName() + " (" + client + ") re-enabled"})
}

// rebuild starts a rebuild of the named projection in this process.
func (u *UI) rebuild(w http.ResponseWriter, r *http.Request, ses session) {
	name := r.PostFormValue("name")
	res, err := u.api.projs.RebuildProjection(as(r.Context(), ses), &locksv1.RebuildProjectionRequest{Name: name})
	if err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.panels.reset()
	u.log.Info("dashboard: rebuild started", "projection", name)
	u.render(w, http.StatusOK, "result", map[string]any{"Msg": "rebuild of " + res.GetRebuild().GetProjection() + " started"})
}
