package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/runbook"
	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// listAlerts is the page-token list of ListAlerts (a value of its own, away from pagetoken.go's).
const listAlerts list = 100

// alertService lists the alerts the alerter keeps in Postgres (alerts, alert_notices).
type alertService struct {
	locksv1.UnimplementedAlertServiceServer
	s *Server
}

func (as *alertService) ListAlerts(ctx context.Context, req *locksv1.ListAlertsRequest) (*locksv1.ListAlertsResponse, error) {
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	var firing *bool
	switch req.GetState() {
	case locksv1.AlertState_ALERT_STATE_UNSPECIFIED:
	case locksv1.AlertState_ALERT_STATE_FIRING, locksv1.AlertState_ALERT_STATE_RESOLVED:
		f := req.GetState() == locksv1.AlertState_ALERT_STATE_FIRING
		firing = &f
	default:
		return nil, fieldErr("state", "want ALERT_STATE_FIRING or ALERT_STATE_RESOLVED")
	}
	scope := req.GetState().String() + "\x00" + req.GetKind()
	key, err := decodePageToken(req.GetPageToken(), listAlerts, scope)
	if err != nil {
		return nil, err
	}
	before := int64(0) // newest first: ids below the last one of the previous page
	if key != "" {
		if before, err = strconv.ParseInt(key, 10, 64); err != nil {
			return nil, fieldErr("page_token", "not a page token of this list")
		}
	}
	rows, err := as.s.db.Query(ctx, `SELECT a.id, a.kind, a.subject, a.summary, a.details, a.fired_at, a.resolved_at,
			coalesce((SELECT json_agg(json_build_object('event', n.event, 'channel', n.channel, 'sent_at', n.sent_at,
				'attempts', n.attempts, 'last_error', coalesce(n.last_error, '')) ORDER BY n.id)
				FROM alert_notices n WHERE n.alert_id = a.id), '[]')
		FROM alerts a
		WHERE ($1 = 0 OR a.id < $1) AND ($2::bool IS NULL OR (a.resolved_at IS NULL) = $2) AND ($3 = '' OR a.kind = $3)
		ORDER BY a.id DESC LIMIT $4`, before, firing, req.GetKind(), n+1)
	if err != nil {
		return nil, fmt.Errorf("list alerts: %w", err)
	}
	alerts, err := pgx.CollectRows(rows, scanAlert)
	if err != nil {
		return nil, fmt.Errorf("list alerts: %w", err)
	}
	out := &locksv1.ListAlertsResponse{}
	if len(alerts) > n {
		alerts = alerts[:n]
		out.NextPageToken = encodePageToken(listAlerts, scope, strconv.FormatInt(alerts[n-1].GetId(), 10))
	}
	out.Alerts = alerts
	return out, nil
}

func scanAlert(r pgx.CollectableRow) (*locksv1.Alert, error) {
	var a locksv1.Alert
	var details, notices []byte
	var fired time.Time
	var resolved *time.Time
	if err := r.Scan(&a.Id, &a.Kind, &a.Subject, &a.Summary, &details, &fired, &resolved, &notices); err != nil {
		return nil, err
	}
	a.FiredTime, a.State = timestamppb.New(fired), locksv1.AlertState_ALERT_STATE_FIRING
	a.RunbookUrl = runbook.URL(a.Kind)
	if resolved != nil {
		a.ResolvedTime, a.State = timestamppb.New(*resolved), locksv1.AlertState_ALERT_STATE_RESOLVED
	}
	var d map[string]any
	if json.Unmarshal(details, &d) == nil {
		if s, err := structpb.NewStruct(d); err == nil {
			a.Details = s
		}
	}
	var ns []struct {
		Event     string     `json:"event"`
		Channel   string     `json:"channel"`
		SentAt    *time.Time `json:"sent_at"`
		Attempts  int32      `json:"attempts"`
		LastError string     `json:"last_error"`
	}
	if err := json.Unmarshal(notices, &ns); err != nil {
		return nil, fmt.Errorf("alert %d notices: %w", a.Id, err)
	}
	for _, n := range ns {
		an := &locksv1.AlertNotice{Event: n.Event, Channel: n.Channel, Attempts: n.Attempts, LastError: n.LastError}
		if n.SentAt != nil {
			an.SentTime = timestamppb.New(*n.SentAt)
		}
		a.Notices = append(a.Notices, an)
	}
	return &a, nil
}
