package ui

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// A client's own page: signed in with a client token (POST /v1/clients/{id}/tokens), the
// people behind a client see their sensors with state and connection, the sensors' recent
// events, their deliveries and dead letters (Resend), their statistics, and can send a test
// event and rotate their signing secret. Every read and action is an API call made with the
// client token itself, so the API's permission table (api/authz.go) bounds the page whatever
// it asks; and the dashboard answers 403 to a client session on every other page (UI.allowed).

// ClientTokens says whose a client token is.
type ClientTokens interface {
	// ClientOfToken is the id of token's client, or an error when token is no (longer a)
	// client token.
	ClientOfToken(ctx context.Context, token string) (string, error)
}

// clientPanels are the panels of a client's page.
var clientPanels = map[string]bool{"sensors": true, "events": true, "deliveries": true, "stats": true}

const (
	// clientSensorsEvents bounds the sensors whose recent events one refresh reads (a query
	// each); the panel says when there are more.
	clientSensorsEvents = 20
	// clientRecent is how far back the events and attempts panels look.
	clientRecent = 24 * time.Hour
	// clientRowsShown is how many events and attempts those panels show, newest first.
	clientRowsShown = 50
)

func (u *UI) clientPage(w http.ResponseWriter, r *http.Request, ses session) {
	ctx, cancel := context.WithTimeout(as(r.Context(), ses), panelTimeout)
	defer cancel()
	data := map[string]any{"CSRF": u.sessions.csrf(ses), "Refresh": fmt.Sprintf("every %dms", u.cfg.Refresh.Milliseconds()),
		"ClientID": ses.clientID}
	c, err := u.api.clients.GetClient(ctx, &locksv1.GetClientRequest{Id: ses.clientID})
	if err != nil {
		data["Error"] = errText(err)
	}
	data["Client"] = c.GetClient()
	u.render(w, http.StatusOK, "client.html", data)
}

// clientPanel renders one panel of a client's page. Its data is shared by that client's open
// tabs (panelCache, keyed by the client), never with another client's.
func (u *UI) clientPanel(w http.ResponseWriter, r *http.Request, ses session) {
	name := r.PathValue("name")
	if !clientPanels[name] {
		http.NotFound(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(as(r.Context(), ses), panelTimeout)
	defer cancel()
	shared, err := u.panels.get(ctx, "client/"+ses.clientID+"/"+name, u.cfg.Refresh/2, func(ctx context.Context) (map[string]any, error) {
		return u.loadClientPanel(ctx, ses.clientID, name)
	})
	data := maps.Clone(shared)
	if data == nil {
		data = map[string]any{}
	}
	data["Now"], data["CSRF"], data["ClientID"] = u.now(), u.sessions.csrf(ses), ses.clientID
	if err != nil {
		data["Error"] = errText(err)
	}
	u.render(w, http.StatusOK, "client-"+name, data)
}

// loadClientPanel reads what a client's panel shows; ctx carries the client's token.
func (u *UI) loadClientPanel(ctx context.Context, clientID, name string) (map[string]any, error) {
	data := map[string]any{}
	var err error
	switch name {
	case "sensors":
		data["Sensors"], data["Capped"], err = u.api.clientSensors(ctx, clientID)
	case "events":
		data["Events"], data["More"], err = u.api.clientEvents(ctx, clientID, u.now())
		data["Shown"] = clientSensorsEvents
	case "deliveries":
		var dead []*locksv1.DeadDelivery
		dead, err = u.api.deadLetters(ctx, clientID)
		data["Dead"] = dead
		if err == nil {
			data["Attempts"], err = u.api.clientAttempts(ctx, clientID, u.now())
		}
	case "stats":
		var res *locksv1.GetClientStatsResponse
		res, err = u.api.controls.GetClientStats(ctx, &locksv1.GetClientStatsRequest{Id: clientID})
		data["Stats"] = res.GetStats()
	}
	return data, err
}

func (a *apiClient) clientSensors(ctx context.Context, clientID string) ([]*locksv1.Sensor, bool, error) {
	return pages(func(tok string) ([]*locksv1.Sensor, string, error) {
		res, err := a.subs.ListClientSensors(ctx, &locksv1.ListClientSensorsRequest{ClientId: clientID, PageSize: 1000, PageToken: tok})
		return res.GetSensors(), res.GetNextPageToken(), err
	})
}

type clientEvent struct {
	SensorID string
	*locksv1.SensorEvent
	Time time.Time
}

// clientEvents are the recent events of the client's first sensors, newest first, and
// whether it has more sensors than were read.
func (a *apiClient) clientEvents(ctx context.Context, clientID string, now time.Time) ([]clientEvent, bool, error) {
	res, err := a.subs.ListClientSensors(ctx, &locksv1.ListClientSensorsRequest{ClientId: clientID, PageSize: clientSensorsEvents})
	if err != nil {
		return nil, false, err
	}
	var out []clientEvent
	for _, s := range res.GetSensors() {
		evs, err := a.history.ListSensorEvents(ctx, &locksv1.ListSensorEventsRequest{SensorId: s.GetId(),
			StartTime: timestamppb.New(now.Add(-clientRecent)), PageSize: 1000})
		if err != nil {
			return out, false, err
		}
		for _, e := range evs.GetEvents() {
			out = append(out, clientEvent{SensorID: s.GetId(), SensorEvent: e, Time: e.GetTime().AsTime()})
		}
	}
	slices.SortStableFunc(out, func(x, y clientEvent) int { return y.Time.Compare(x.Time) })
	return out[:min(len(out), clientRowsShown)], res.GetNextPageToken() != "", nil
}

// clientAttempts are the client's webhook attempts of the last clientRecent, newest first.
func (a *apiClient) clientAttempts(ctx context.Context, clientID string, now time.Time) ([]*locksv1.Delivery, error) {
	all, _, err := pages(func(tok string) ([]*locksv1.Delivery, string, error) {
		res, err := a.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: clientID,
			StartTime: timestamppb.New(now.Add(-clientRecent)), PageSize: 1000, PageToken: tok})
		return res.GetDeliveries(), res.GetNextPageToken(), err
	})
	slices.Reverse(all)
	return all[:min(len(all), clientRowsShown)], err
}

// clientResend sends one of the client's dead letters again.
func (u *UI) clientResend(w http.ResponseWriter, r *http.Request, ses session) {
	evt := r.PostFormValue("event_id")
	if err := u.api.resend(as(r.Context(), ses), ses.clientID, evt); err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.panels.reset()
	u.log.Info("dashboard: dead letter resent by its client", "client_id", ses.clientID, "event_id", evt)
	u.render(w, http.StatusOK, "result", map[string]any{"Msg": evt + " sent again"})
}

// testEvent sends the client a signed sensor.test webhook.
func (u *UI) testEvent(w http.ResponseWriter, r *http.Request, ses session) {
	res, err := u.api.controls.SendTestEvent(as(r.Context(), ses), &locksv1.SendTestEventRequest{Id: ses.clientID})
	if err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.panels.reset()
	u.render(w, http.StatusOK, "result", map[string]any{"Msg": "test event " + res.GetEventId() + " sent"})
}

// rotateSecret gives the client a new signing secret, shown this once; the old one keeps
// signing beside it for the API's overlap.
func (u *UI) rotateSecret(w http.ResponseWriter, r *http.Request, ses session) {
	res, err := u.api.clients.RotateClientSecret(as(r.Context(), ses), &locksv1.RotateClientSecretRequest{Id: ses.clientID})
	if err != nil {
		u.render(w, http.StatusOK, "result", map[string]any{"Error": errText(err)})
		return
	}
	u.log.Info("dashboard: signing secret rotated by its client", "client_id", ses.clientID)
	data := map[string]any{"Secret": res.GetClient().GetSigningSecret()}
	if until := res.GetClient().GetPreviousSecretUntil(); until != nil {
		data["Until"] = until.AsTime()
	}
	u.render(w, http.StatusOK, "secret", data)
}
