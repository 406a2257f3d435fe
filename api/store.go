package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// DB is what the API needs of Postgres; *pgxpool.Pool is one.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// etagOf identifies one version of one resource. The creation time is in it so that a
// resource deleted and created again does not repeat the etags of the old one.
func etagOf(id string, created time.Time, version int64) string {
	h := sha256.New()
	h.Write([]byte(id))
	var b [17]byte
	binary.BigEndian.PutUint64(b[1:9], uint64(created.UnixMicro()))
	binary.BigEndian.PutUint64(b[9:], uint64(version))
	h.Write(b[:])
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:12])
}

// normEtag accepts an etag as sent in a body, a query or an If-Match header: bare, quoted,
// or weak (W/"…").
func normEtag(e string) string {
	e = strings.TrimSpace(e)
	e = strings.TrimPrefix(e, "W/")
	return strings.Trim(e, `"`)
}

// ifMatch returns the etags of the call's If-Match header (REST, forwarded by the gateway)
// or if-match metadata (gRPC).
func ifMatch(ctx context.Context) []string {
	md, _ := metadata.FromIncomingContext(ctx)
	var out []string
	for _, k := range []string{"if-match", "grpcgateway-if-match"} {
		for _, v := range md.Get(k) {
			for _, e := range strings.Split(v, ",") {
				if e = normEtag(e); e != "" {
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// checkEtag fails with a StaleError unless every etag given (in the body or query, and in
// If-Match) is the current one. "*" matches any current version; none given means the
// change is unconditional.
func checkEtag(ctx context.Context, kind, id, current, given string) error {
	all := ifMatch(ctx)
	if g := normEtag(given); g != "" {
		all = append(all, g)
	}
	for _, e := range all {
		if e != "*" && e != current {
			return &StaleError{Kind: kind, ID: id, Etag: e}
		}
	}
	return nil
}

func ts(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func tsOpt(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

func isForeignKeyViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}

// clientRow is a row of clients.
type clientRow struct {
	ID, Name, WebhookURL, Secret string
	PrevSecret                   *string
	PrevUntil                    *time.Time
	Version                      int64
	Created, Updated             time.Time
	EventTypes                   []string
	DisabledAt                   *time.Time
	DisabledReason               *string
}

const clientCols = `c.id, c.name, c.webhook_url, c.signing_secret, c.previous_secret, c.previous_secret_until, c.version, c.created_at, c.updated_at,
	c.event_types, c.disabled_at, c.disabled_reason`

func scanClient(row pgx.Row) (clientRow, error) {
	var c clientRow
	err := row.Scan(&c.ID, &c.Name, &c.WebhookURL, &c.Secret, &c.PrevSecret, &c.PrevUntil, &c.Version, &c.Created, &c.Updated,
		&c.EventTypes, &c.DisabledAt, &c.DisabledReason)
	return c, err
}

func (c clientRow) etag() string { return etagOf(c.ID, c.Created, c.Version) }

// proto renders the client; secrets only when withSecrets (not in lists). A previous secret
// whose time is over is no longer shown: it no longer signs.
func (c clientRow) proto(withSecrets bool, now time.Time) *locksv1.Client {
	p := &locksv1.Client{
		Id: c.ID, Name: c.Name, WebhookUrl: c.WebhookURL,
		CreateTime: ts(c.Created), UpdateTime: ts(c.Updated), Etag: c.etag(), EventTypes: c.EventTypes,
	}
	if c.DisabledAt != nil {
		p.DisabledTime = ts(*c.DisabledAt)
	}
	if c.DisabledReason != nil {
		p.DisabledReason = *c.DisabledReason
	}
	if withSecrets {
		p.SigningSecret = c.Secret
		if c.PrevSecret != nil && c.PrevUntil != nil && c.PrevUntil.After(now) {
			p.PreviousSecret = *c.PrevSecret
			p.PreviousSecretUntil = ts(*c.PrevUntil)
		}
	}
	return p
}

// sensorRow is a row of sensors with the sensor's state, if any.
type sensorRow struct {
	ID, Address      string
	LostAfterMS      *int64
	Version          int64
	Created, Updated time.Time
	State            *stateRow
}

// stateRow is a row of sensor_state.
type stateRow struct {
	SensorID                             string
	Data                                 int16
	Connection                           string
	LastSeen, LastReadingTime, ChangedAt time.Time
	Revision                             int64
}

const (
	sensorCols = `s.id, s.address, s.lost_after_ms, s.version, s.created_at, s.updated_at`
	stateCols  = `st.sensor_id, st.data, st.connection, st.last_seen, st.last_reading_time, st.changed_at, st.revision`
)

func scanState(row pgx.Row) (stateRow, error) {
	var st stateRow
	err := row.Scan(&st.SensorID, &st.Data, &st.Connection, &st.LastSeen, &st.LastReadingTime, &st.ChangedAt, &st.Revision)
	return st, err
}

// scanSensor reads sensorCols followed by stateCols of a LEFT JOIN.
func scanSensor(row pgx.Row) (sensorRow, error) {
	var s sensorRow
	var (
		stID                  *string
		data                  *int16
		conn                  *string
		seen, readAt, changed *time.Time
		rev                   *int64
	)
	err := row.Scan(&s.ID, &s.Address, &s.LostAfterMS, &s.Version, &s.Created, &s.Updated,
		&stID, &data, &conn, &seen, &readAt, &changed, &rev)
	if err != nil {
		return s, err
	}
	if stID != nil {
		s.State = &stateRow{SensorID: *stID, Data: *data, Connection: *conn, LastSeen: *seen,
			LastReadingTime: *readAt, ChangedAt: *changed, Revision: *rev}
	}
	return s, nil
}

func (s sensorRow) etag() string { return etagOf(s.ID, s.Created, s.Version) }

// proto is the sensor as the API shows it; seenBound is how far its state's liveness may
// lag (Config.StateSeenInterval).
func (s sensorRow) proto(seenBound time.Duration) *locksv1.Sensor {
	p := &locksv1.Sensor{
		Id: s.ID, Address: s.Address,
		CreateTime: ts(s.Created), UpdateTime: ts(s.Updated), Etag: s.etag(),
	}
	if s.LostAfterMS != nil {
		p.LostAfter = durationpb.New(time.Duration(*s.LostAfterMS) * time.Millisecond)
	}
	if s.State != nil {
		p.State = s.State.proto(seenBound)
	}
	return p
}

func connectionOf(c string) locksv1.Connection {
	switch c {
	case "online":
		return locksv1.Connection_CONNECTION_ONLINE
	case "lost":
		return locksv1.Connection_CONNECTION_LOST
	}
	return locksv1.Connection_CONNECTION_UNSPECIFIED
}

// proto is the state as the API shows it, with seenBound, the bound of its liveness.
func (st stateRow) proto(seenBound time.Duration) *locksv1.SensorState {
	return &locksv1.SensorState{
		SensorId:        st.SensorID,
		Data:            int32(st.Data),
		Connection:      connectionOf(st.Connection),
		LastSeenTime:    ts(st.LastSeen),
		ChangedTime:     ts(st.ChangedAt),
		Revision:        st.Revision,
		LastReadingTime: ts(st.LastReadingTime),
		LastSeenBound:   durationpb.New(seenBound),
	}
}
