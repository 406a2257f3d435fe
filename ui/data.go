package ui

import (
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// The dashboard reads what the admin API serves, through its in-process gRPC connection and
// with the operator's token, so that it shows exactly what a client of the API sees and adds
// no queries of its own. The per-client figures (clientStats) are derived from the attempt
// history and the dead letters for now; when the API gains per-client statistics and the
// endpoint's disabled_time, clientStats is the one function to switch to them.

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
}

func newAPIClient(cc grpc.ClientConnInterface) *apiClient {
	return &apiClient{clients: locksv1.NewClientServiceClient(cc), sensors: locksv1.NewSensorServiceClient(cc),
		history: locksv1.NewHistoryServiceClient(cc), projs: locksv1.NewProjectionServiceClient(cc),
		setAside: locksv1.NewSetAsideServiceClient(cc), overview: locksv1.NewOverviewServiceClient(cc)}
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
	var out []lostSensor
	q = strings.ToLower(strings.TrimSpace(q))
	tok := ""
	capped := true
	for range maxScan {
		res, err := a.sensors.ListSensors(ctx, &locksv1.ListSensorsRequest{PageSize: 1000, PageToken: tok,
			Connection: locksv1.Connection_CONNECTION_LOST})
		if err != nil {
			return nil, false, err
		}
		for _, s := range res.GetSensors() {
			if q != "" && !strings.Contains(strings.ToLower(s.GetId()), q) && !strings.Contains(strings.ToLower(s.GetAddress()), q) {
				continue
			}
			out = append(out, lostSensor{ID: s.GetId(), Address: s.GetAddress(), LastSeen: s.GetState().GetLastSeenTime().AsTime()})
		}
		if tok = res.GetNextPageToken(); tok == "" {
			capped = false
			break
		}
	}
	slices.SortFunc(out, func(x, y lostSensor) int { return x.LastSeen.Compare(y.LastSeen) })
	return out, capped, nil
}

func (a *apiClient) listClients(ctx context.Context) ([]*locksv1.Client, error) {
	var out []*locksv1.Client
	tok := ""
	for range maxScan {
		res, err := a.clients.ListClients(ctx, &locksv1.ListClientsRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return nil, err
		}
		out = append(out, res.GetClients()...)
		if tok = res.GetNextPageToken(); tok == "" {
			break
		}
	}
	return out, nil
}

type clientStat struct {
	ID, Name, URL     string
	OK, Failing, Dead int
	P99               time.Duration
	LastSuccess       time.Time
	Disabled          string // "" when the API does not say (see the comment at the top)
	Err               string
}

// statsWindow is how far back the attempt history is read for the per-client figures.
const statsWindow = time.Hour

// clientStat is a client's deliveries over the last statsWindow: delivered, failing (an
// event whose last attempt failed and is waiting for a retry), dead now, the p99 latency of
// the attempts, and the last success.
func (a *apiClient) clientStat(ctx context.Context, c *locksv1.Client, now time.Time) clientStat {
	st := clientStat{ID: c.GetId(), Name: c.GetName(), URL: c.GetWebhookUrl()}
	last := map[string]locksv1.DeliveryOutcome{}
	var lat []time.Duration
	tok := ""
	for range maxScan {
		res, err := a.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: c.GetId(),
			StartTime: timestamppb.New(now.Add(-statsWindow)), PageSize: 1000, PageToken: tok})
		if err != nil {
			st.Err = err.Error()
			break
		}
		for _, d := range res.GetDeliveries() {
			lat = append(lat, d.GetLatency().AsDuration())
			last[d.GetEventId()] = d.GetOutcome()
			if d.GetOutcome() == locksv1.DeliveryOutcome_DELIVERY_OUTCOME_DELIVERED {
				st.LastSuccess = d.GetTime().AsTime()
			}
		}
		if tok = res.GetNextPageToken(); tok == "" {
			break
		}
	}
	for _, o := range last {
		switch o {
		case locksv1.DeliveryOutcome_DELIVERY_OUTCOME_DELIVERED:
			st.OK++
		case locksv1.DeliveryOutcome_DELIVERY_OUTCOME_RETRY:
			st.Failing++
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		st.P99 = lat[(len(lat)*99+99)/100-1]
	}
	dead, err := a.deadLetters(ctx, c.GetId())
	if err != nil && st.Err == "" {
		st.Err = err.Error()
	}
	st.Dead = len(dead)
	return st
}

func (a *apiClient) deadLetters(ctx context.Context, clientID string) ([]*locksv1.DeadDelivery, error) {
	var out []*locksv1.DeadDelivery
	tok := ""
	for range maxScan {
		res, err := a.history.ListClientDeliveries(ctx, &locksv1.ListClientDeliveriesRequest{ClientId: clientID,
			State: "dead", PageSize: 1000, PageToken: tok})
		if err != nil {
			return out, err
		}
		out = append(out, res.GetDeadDeliveries()...)
		if tok = res.GetNextPageToken(); tok == "" {
			break
		}
	}
	return out, nil
}

// resend sends one dead letter again, with the redrive call over a window that holds only its
// dead time (the dead-letter store keeps microseconds).
func (a *apiClient) resend(ctx context.Context, clientID string, deadTime time.Time) (int32, error) {
	res, err := a.history.RedriveClientDeliveries(ctx, &locksv1.RedriveClientDeliveriesRequest{ClientId: clientID,
		StartTime: timestamppb.New(deadTime), EndTime: timestamppb.New(deadTime.Add(time.Microsecond))})
	return res.GetRedriven(), err
}
