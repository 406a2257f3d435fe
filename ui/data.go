package ui

import (
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The dashboard reads what the admin API serves, through its in-process gRPC connection and
// with the operator's token, so that it shows exactly what a client of the API sees and adds
// no queries of its own.

// maxScan bounds the pages a panel reads per refresh, so a huge fleet slows nothing down;
// the lost list says when it reached the bound.
const maxScan = 20

type apiClient struct {
	clients  locksv1.ClientServiceClient
	sensors  locksv1.SensorServiceClient
	history  locksv1.HistoryServiceClient
	projs    locksv1.ProjectionServiceClient
	setAside locksv1.SetAsideServiceClient
	overview locksv1.OverviewServiceClient
	controls locksv1.WebhookControlServiceClient
	alerts   locksv1.AlertServiceClient
	subs     locksv1.SubscriptionServiceClient
}

func newAPIClient(cc grpc.ClientConnInterface) *apiClient {
	return &apiClient{clients: locksv1.NewClientServiceClient(cc), sensors: locksv1.NewSensorServiceClient(cc),
		history: locksv1.NewHistoryServiceClient(cc), projs: locksv1.NewProjectionServiceClient(cc),
		setAside: locksv1.NewSetAsideServiceClient(cc), overview: locksv1.NewOverviewServiceClient(cc),
		controls: locksv1.NewWebhookControlServiceClient(cc), alerts: locksv1.NewAlertServiceClient(cc),
		subs: locksv1.NewSubscriptionServiceClient(cc)}
}

// as is ctx carrying the session's token, as a REST or gRPC client would send it.
func as(ctx context.Context, ses session) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+ses.token)
}

func (a *apiClient) sensorCounts(ctx context.Context) (*locksv1.GetSensorCountsResponse, error) {
	return a.overview.GetSensorCounts(ctx, &locksv1.GetSensorCountsRequest{})
}

type lostSensor struct {
	ID, Address string
	LastSeen    time.Time
}

// lostSensors are the registered sensors lost now whose id or address contains q, longest
// lost first.
func (a *apiClient) lostSensors(ctx context.Context, q string) ([]lostSensor, bool, error) {
	q = strings.ToLower(strings.TrimSpace(q))
	all, capped, err := pages(func(tok string) ([]*locksv1.Sensor, string, error) {
		res, err := a.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1000, PageToken: tok,
			Connection: locksv1.Connection_CONNECTION_LOST})
		return res.GetSensors(), res.GetNextPageToken(), err
	})
	if err != nil {
		return nil, false, err
	}
	var out []lostSensor
	for _, s := range all {
		if q != "" && !strings.Contains(strings.ToLower(s.GetId()), q) && !strings.Contains(strings.ToLower(s.GetAddress()), q) {
			continue
		}
		out = append(out, lostSensor{ID: s.GetId(), Address: s.GetAddress(), LastSeen: s.GetState().GetLastSeenTime().AsTime()})
	}
	slices.SortFunc(out, func(x, y lostSensor) int { return x.LastSeen.Compare(y.LastSeen) })
	return out, capped, nil
}

func (a *apiClient) listClients(ctx context.Context) ([]*locksv1.Client, error) {
	out, _, err := pages(func(tok string) ([]*locksv1.Client, string, error) {
		res, err := a.clients.ListClients(ctx, &locksv1.ListClientsRequest{PageSize: 1000, PageToken: tok})
		return res.GetClients(), res.GetNextPageToken(), err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// clientsShown bounds the clients whose statistics one refresh reads (a query each); the
// panel says when there are more.
const clientsShown = 200

type clientStat struct {
	ID, Name, URL        string
	*locksv1.ClientStats // nil when reading them failed (Err)
	P99                  time.Duration
	LastSuccess          time.Time
	DisabledAt           time.Time // zero while the endpoint is enabled
	DisabledReason       string
	Err                  string
}

// Failing is an endpoint with failed attempts and deliveries dead or waiting for a retry.
func (s clientStat) Failing() bool {
	return s.ClientStats != nil && s.GetFailedAttempts() > 0 && (s.GetDead() > 0 || s.GetPending() > 0)
}

// clientStat is a client's delivery statistics as GetClientStats serves them (the
// deliveries the notifier keeps), and whether its endpoint is disabled and why.
func (a *apiClient) clientStat(ctx context.Context, c *locksv1.Client) clientStat {
	st := clientStat{ID: c.GetId(), Name: c.GetName(), URL: c.GetWebhookUrl(), DisabledReason: c.GetDisabledReason()}
	if c.GetDisabledTime() != nil {
		st.DisabledAt = c.GetDisabledTime().AsTime()
	}
	res, err := a.controls.GetClientStats(ctx, &locksv1.GetClientStatsRequest{Id: c.GetId()})
	if err != nil {
		st.Err = errText(err)
		return st
	}
	s := res.GetStats()
	st.ClientStats = s
	st.P99 = time.Duration(s.GetLatencyP99Ms() * float64(time.Millisecond)).Round(time.Millisecond / 10)
	if s.GetLastSuccessTime() != nil {
		st.LastSuccess = s.GetLastSuccessTime().AsTime()
	}
	// The statistics are read after the client: they say whether it is disabled now.
	st.DisabledAt, st.DisabledReason = time.Time{}, s.GetDisabledReason()
	if s.GetDisabledTime() != nil {
		st.DisabledAt = s.GetDisabledTime().AsTime()
	}
	return st
}

func (a *apiClient) deadLetters(ctx context.Context, clientID string) ([]*locksv1.DeadDelivery, error) {
	out, _, err := pages(func(tok string) ([]*locksv1.DeadDelivery, string, error) {
		res, err := a.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: clientID,
			State: "dead", PageSize: 1000, PageToken: tok})
		return res.GetDeadDeliveries(), res.GetNextPageToken(), err
	})
	return out, err // what was read before an error is shown with it
}

// pages reads up to maxScan pages through page (a page's items and the next token from
// tok), and says whether pages were left unread (capped). On an error it returns what the
// earlier pages held.
func pages[T any](page func(tok string) ([]T, string, error)) (out []T, capped bool, err error) {
	tok := ""
	for range maxScan {
		items, next, err := page(tok)
		if err != nil {
			return out, false, err
		}
		out = append(out, items...)
		if tok = next; tok == "" {
			return out, false, nil
		}
	}
	return out, true, nil
}

// resend sends one delivery again (a dead letter), with a fresh schedule and the same webhook-id.
func (a *apiClient) resend(ctx context.Context, clientID, eventID string) error {
	_, err := a.controls.ResendDelivery(ctx, &locksv1.ResendDeliveryRequest{ClientId: clientID, EventId: eventID})
	return err
}

// enable re-enables a client's endpoint: the deliveries that waited go out.
func (a *apiClient) enable(ctx context.Context, clientID string) (*locksv1.Client, error) {
	res, err := a.controls.EnableClient(ctx, &locksv1.EnableClientRequest{Id: clientID})
	return res.GetClient(), err
}

// alertsShown is how many alerts of each state the alerts panel shows.
const alertsShown = 50

// alertLists are the alerts firing now and the last resolved ones, newest first.
func (a *apiClient) alertLists(ctx context.Context) (firing, resolved []*locksv1.Alert, err error) {
	f, err := a.alerts.ListAlerts(ctx, &locksv1.ListAlertsRequest{State: locksv1.AlertState_ALERT_STATE_FIRING, PageSize: alertsShown})
	if err != nil {
		return nil, nil, err
	}
	r, err := a.alerts.ListAlerts(ctx, &locksv1.ListAlertsRequest{State: locksv1.AlertState_ALERT_STATE_RESOLVED, PageSize: alertsShown})
	if err != nil {
		return f.GetAlerts(), nil, err
	}
	return f.GetAlerts(), r.GetAlerts(), nil
}
