package api

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Authorization: which token may make which call. Administrator tokens (LOCKS_API_TOKENS) may
// make every call; a client token (tokens.go) only the calls of its own client that
// permissions lists, and only for that client (and the sensors it is subscribed to). decide is
// the one place that says so, for gRPC and REST alike (the gateway calls over gRPC, through the
// same interceptor); Server.authorize adds the one fact decide cannot know, whether the client
// is subscribed to a sensor. A refusal is the same PERMISSION_DENIED whether the resource
// exists or not, so that a client token learns nothing about other clients and sensors.

// principal is who makes a call: an administrator, or a client token's client.
type principal struct {
	admin    bool
	clientID string // of a client token
	tokenID  string // of a client token
}

// access is what a client token needs for a call.
type access int

const (
	// adminOnly: no client token may make the call.
	adminOnly access = iota
	// ownClient: the request's client field must be the token's client.
	ownClient
	// ownClientUpdate: ownClient, and the update changes only webhook_url and event_types.
	ownClientUpdate
	// subscribedSensor: the request's sensor field must name a sensor the token's client is
	// subscribed to.
	subscribedSensor
)

func (a access) String() string {
	switch a {
	case ownClient:
		return "own client"
	case ownClientUpdate:
		return "own client: webhook_url, event_types"
	case subscribedSensor:
		return "subscribed sensors"
	}
	return "no"
}

// permission is one call of the API and what a client token needs to make it.
type permission struct {
	Method string // gRPC full method, /locks.v1.Service/Method
	REST   string // its REST route, "GET /v1/clients/{id}"
	Access access
	Field  string // the request field naming the client or sensor
}

// permissions is the table of every call: docs/contract.md prints it (permissionsMarkdown) and
// the permission matrix test calls every row. A method missing here is for administrators only.
var permissions = []permission{
	{"/locks.v1.ClientService/CreateClient", "POST /v1/clients", adminOnly, ""},
	{"/locks.v1.ClientService/GetClient", "GET /v1/clients/{id}", ownClient, "id"},
	{"/locks.v1.ClientService/ListClients", "GET /v1/clients", adminOnly, ""},
	{"/locks.v1.ClientService/UpdateClient", "PATCH /v1/clients/{id}", ownClientUpdate, "id"},
	{"/locks.v1.ClientService/DeleteClient", "DELETE /v1/clients/{id}", adminOnly, ""},
	{"/locks.v1.ClientService/RotateClientSecret", "POST /v1/clients/{id}:rotateSecret", ownClient, "id"},
	{"/locks.v1.WebhookControlService/SendTestEvent", "POST /v1/clients/{id}:sendTestEvent", ownClient, "id"},
	{"/locks.v1.WebhookControlService/GetClientStats", "GET /v1/clients/{id}/stats", ownClient, "id"},
	{"/locks.v1.WebhookControlService/EnableClient", "POST /v1/clients/{id}:enable", adminOnly, ""},
	{"/locks.v1.WebhookControlService/DisableClient", "POST /v1/clients/{id}:disable", adminOnly, ""},
	{"/locks.v1.HistoryService/ListClientDeliveries", "GET /v1/clients/{client_id}/deliveries", ownClient, "client_id"},
	{"/locks.v1.HistoryService/RedriveClientDeliveries", "POST /v1/clients/{client_id}/deliveries:redrive", ownClient, "client_id"},
	{"/locks.v1.WebhookControlService/ResendDelivery", "POST /v1/clients/{client_id}/deliveries/{event_id}:resend", ownClient, "client_id"},
	{"/locks.v1.ClientEventService/ListClientEvents", "GET /v1/clients/{client_id}/events", ownClient, "client_id"},
	{"/locks.v1.ClientEventService/WatchClientEvents", "GET /v1/clients/{client_id}/events:watch", ownClient, "client_id"},
	{"/locks.v1.SubscriptionService/ListClientSensors", "GET /v1/clients/{client_id}/sensors", ownClient, "client_id"},
	{"/locks.v1.ClientTokenService/CreateClientToken", "POST /v1/clients/{client_id}/tokens", adminOnly, ""},
	{"/locks.v1.ClientTokenService/ListClientTokens", "GET /v1/clients/{client_id}/tokens", adminOnly, ""},
	{"/locks.v1.ClientTokenService/DeleteClientToken", "DELETE /v1/clients/{client_id}/tokens/{token_id}", adminOnly, ""},
	{"/locks.v1.SensorService/CreateSensor", "POST /v1/sensors", adminOnly, ""},
	{"/locks.v1.SensorService/GetSensor", "GET /v1/sensors/{id}", adminOnly, ""},
	{"/locks.v1.SensorService/ListSensors", "GET /v1/sensors", adminOnly, ""},
	{"/locks.v1.SensorService/UpdateSensor", "PATCH /v1/sensors/{id}", adminOnly, ""},
	{"/locks.v1.SensorService/DeleteSensor", "DELETE /v1/sensors/{id}", adminOnly, ""},
	{"/locks.v1.SensorService/BatchCreateSensors", "POST /v1/sensors:batchCreate", adminOnly, ""},
	{"/locks.v1.OverviewService/GetSensorCounts", "GET /v1/sensors:count", adminOnly, ""},
	{"/locks.v1.StateService/GetSensorState", "GET /v1/sensors/{sensor_id}/state", subscribedSensor, "sensor_id"},
	{"/locks.v1.HistoryService/ListSensorReadings", "GET /v1/sensors/{sensor_id}/readings", subscribedSensor, "sensor_id"},
	{"/locks.v1.HistoryService/ListSensorEvents", "GET /v1/sensors/{sensor_id}/events", subscribedSensor, "sensor_id"},
	{"/locks.v1.HistoryService/GetSensorStats", "GET /v1/sensors/{sensor_id}/stats", subscribedSensor, "sensor_id"},
	{"/locks.v1.SubscriptionService/CreateSubscription", "PUT /v1/sensors/{sensor_id}/clients/{client_id}", adminOnly, ""},
	{"/locks.v1.SubscriptionService/DeleteSubscription", "DELETE /v1/sensors/{sensor_id}/clients/{client_id}", adminOnly, ""},
	{"/locks.v1.SubscriptionService/ListSensorClients", "GET /v1/sensors/{sensor_id}/clients", adminOnly, ""},
	{"/locks.v1.SubscriptionService/BatchCreateSubscriptions", "POST /v1/clients/{client_id}/sensors:batchCreate", adminOnly, ""},
	{"/locks.v1.ProjectionService/ListProjections", "GET /v1/projections", adminOnly, ""},
	{"/locks.v1.ProjectionService/RebuildProjection", "POST /v1/projections/{name}:rebuild", adminOnly, ""},
	{"/locks.v1.SetAsideService/ListSetAside", "GET /v1/set-aside", adminOnly, ""},
	{"/locks.v1.AlertService/ListAlerts", "GET /v1/alerts", adminOnly, ""},
}

var permissionOf = func() map[string]permission {
	m := make(map[string]permission, len(permissions))
	for _, p := range permissions {
		m[p.Method] = p
	}
	return m
}()

// verdict is decide's answer: refused (err), allowed, or allowed once the client is found to
// be subscribed to sensor.
type verdict struct {
	err    error
	sensor string
}

// decide says whether p may call method with req, but for the subscription check (a verdict
// with a sensor). It is pure: a function of the token's principal, the method and the request.
func decide(p principal, method string, req any) verdict {
	if p.admin {
		return verdict{}
	}
	perm, ok := permissionOf[method]
	if !ok || perm.Access == adminOnly {
		return verdict{err: fmt.Errorf("%w: %s is for administrator tokens only; a client token may call only its own client's part of the API", ErrPermissionDenied, shortMethod(method))}
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return verdict{err: fmt.Errorf("%w: %s", ErrPermissionDenied, shortMethod(method))}
	}
	value := stringField(msg, perm.Field)
	switch perm.Access {
	case ownClient, ownClientUpdate:
		if value == "" && perm.Access == ownClientUpdate {
			value = stringField(msg, "client.id")
		}
		if value != p.clientID {
			return verdict{err: fmt.Errorf("%w: a client token may call %s for its own client only", ErrPermissionDenied, shortMethod(method))}
		}
		if perm.Access == ownClientUpdate {
			if err := clientTokenUpdate(msg); err != nil {
				return verdict{err: err}
			}
		}
		return verdict{}
	case subscribedSensor:
		// The same refusal for a sensor that does not exist as for one the client is not
		// subscribed to: Server.authorize asks only whether the subscription exists.
		return verdict{sensor: value}
	}
	return verdict{err: fmt.Errorf("%w: %s", ErrPermissionDenied, shortMethod(method))}
}

// clientTokenUpdate refuses an update that changes more than a client token may: the name is
// the administrator's.
func clientTokenUpdate(msg proto.Message) error {
	req, ok := msg.(*locksv1.UpdateClientRequest)
	if !ok {
		return fmt.Errorf("%w: not a client update", ErrPermissionDenied)
	}
	paths, err := maskPaths(req.GetUpdateMask(), clientUpdatable, clientOutputOnly)
	if err != nil {
		return nil // the handler answers the invalid mask with 400, naming it
	}
	for _, p := range paths {
		if p != "webhook_url" && p != "event_types" {
			return fmt.Errorf("%w: a client token may change only webhook_url and event_types, not %s (with gRPC, send an update_mask)", ErrPermissionDenied, p)
		}
	}
	return nil
}

// stringField is the string at a dotted field path of msg ("" when absent).
func stringField(msg proto.Message, path string) string {
	m := msg.ProtoReflect()
	names := strings.Split(path, ".")
	for i, n := range names {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(n))
		if fd == nil {
			return ""
		}
		if i == len(names)-1 {
			if fd.Kind() != protoreflect.StringKind || fd.IsList() {
				return ""
			}
			return m.Get(fd).String()
		}
		if fd.Message() == nil || !m.Has(fd) {
			return ""
		}
		m = m.Get(fd).Message()
	}
	return ""
}

func shortMethod(full string) string { return full[strings.LastIndexByte(full, '/')+1:] }

// authorize is decide plus its subscription check.
func (s *Server) authorize(ctx context.Context, p principal, method string, req any) error {
	v := decide(p, method, req)
	if v.err != nil || p.admin || permissionOf[method].Access != subscribedSensor {
		return v.err
	}
	var ok bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM subscriptions WHERE client_id = $1 AND sensor_id = $2)`,
		p.clientID, v.sensor).Scan(&ok); err != nil {
		return fmt.Errorf("authorize: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: a client token may call %s only for sensors its client is subscribed to", ErrPermissionDenied, shortMethod(method))
	}
	return nil
}

// permissionsMarkdown is the permission table as docs/contract.md prints it.
func permissionsMarkdown() string {
	var b strings.Builder
	b.WriteString("| REST | gRPC | administrator token | client token |\n| --- | --- | --- | --- |\n")
	for _, p := range permissions {
		fmt.Fprintf(&b, "| `%s` | `%s` | yes | %s |\n", p.REST, strings.TrimPrefix(p.Method, "/locks.v1."), p.Access)
	}
	return b.String()
}
