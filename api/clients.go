package api

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// secretOverlap is how long a replaced signing secret keeps signing after a rotation.
const secretOverlap = 24 * time.Hour

// maxSecretOverlap bounds the overlap a rotation may ask for.
const maxSecretOverlap = 7 * 24 * time.Hour

// rotationOverlap is the overlap req asks for: secretOverlap when unset.
func rotationOverlap(req *locksv1.RotateClientSecretRequest) (time.Duration, error) {
	o := req.GetPreviousSecretOverlap()
	if o == nil {
		return secretOverlap, nil
	}
	if err := o.CheckValid(); err != nil {
		return 0, fieldErr("previous_secret_overlap", "not a duration: %v", err)
	}
	d := o.AsDuration()
	if d < 0 || d > maxSecretOverlap {
		return 0, fieldErr("previous_secret_overlap", "must be between 0s (end the old secret at once) and 168h")
	}
	return d, nil
}

// newSecret is `whsec_` + base64 of 32 random bytes (the Standard Webhooks format).
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random secret: %w", err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b), nil
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newClientID is `cl_` + 20 random lower-case letters and digits (100 bits).
func newClientID() (string, error) {
	b := make([]byte, 13)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return "cl_" + idEncoding.EncodeToString(b)[:20], nil
}

type clientService struct {
	locksv1.UnimplementedClientServiceServer
	s *Server
}

func (c *clientService) CreateClient(ctx context.Context, req *locksv1.CreateClientRequest) (*locksv1.CreateClientResponse, error) {
	in := req.GetClient()
	if in == nil {
		return nil, fieldErr("client", "required: {\"name\": …, \"webhook_url\": …}")
	}
	if err := checkText("name", in.GetName(), maxNameLen); err != nil {
		return nil, err
	}
	if err := c.s.checkWebhookURL(ctx, in.GetWebhookUrl()); err != nil {
		return nil, err
	}
	if err := checkEventTypes("event_types", in.GetEventTypes()); err != nil {
		return nil, err
	}
	secret, err := newSecret()
	if err != nil {
		return nil, err
	}
	for range 3 {
		id, err := newClientID()
		if err != nil {
			return nil, err
		}
		row, err := scanClient(c.s.db.QueryRow(ctx, `
			INSERT INTO clients AS c (id, name, webhook_url, signing_secret, event_types) VALUES ($1, $2, $3, $4, $5)
			RETURNING `+clientCols, id, in.GetName(), in.GetWebhookUrl(), secret, storedTypes(in.GetEventTypes())))
		if isUniqueViolation(err) {
			continue // an id drawn twice: draw again
		}
		if err != nil {
			return nil, fmt.Errorf("insert client: %w", err)
		}
		return &locksv1.CreateClientResponse{Client: row.proto(true, time.Now())}, nil
	}
	return nil, errors.New("insert client: could not draw a free id")
}

func (c *clientService) get(ctx context.Context, q DB, id string, lock bool) (clientRow, error) {
	sql := `SELECT ` + clientCols + ` FROM clients c WHERE c.id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	row, err := scanClient(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return row, &NotFoundError{Kind: "client", ID: id}
	}
	if err != nil {
		return row, fmt.Errorf("read client: %w", err)
	}
	return row, nil
}

func (c *clientService) GetClient(ctx context.Context, req *locksv1.GetClientRequest) (*locksv1.GetClientResponse, error) {
	if err := checkClientID("id", req.GetId()); err != nil {
		return nil, err
	}
	row, err := c.get(ctx, c.s.db, req.GetId(), false)
	if err != nil {
		return nil, err
	}
	return &locksv1.GetClientResponse{Client: row.proto(true, time.Now())}, nil
}

func (c *clientService) ListClients(ctx context.Context, req *locksv1.ListClientsRequest) (*locksv1.ListClientsResponse, error) {
	n, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after, err := decodePageToken(req.GetPageToken(), listClients, "")
	if err != nil {
		return nil, err
	}
	rows, err := c.s.db.Query(ctx, `SELECT `+clientCols+` FROM clients c WHERE c.id > $1 ORDER BY c.id LIMIT $2`, after, n+1)
	if err != nil {
		return nil, fmt.Errorf("list clients: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (clientRow, error) { return scanClient(r) })
	if err != nil {
		return nil, fmt.Errorf("list clients: %w", err)
	}
	page, next := nextPage(list, n, listClients, "", func(r clientRow) string { return r.ID })
	out := &locksv1.ListClientsResponse{NextPageToken: next}
	now := time.Now()
	for _, row := range page {
		out.Clients = append(out.Clients, row.proto(false, now))
	}
	return out, nil
}

// updatable fields of a client; output-only ones in a mask are ignored (AIP-161), so that a
// resource read with GET can be sent back whole.
var (
	clientUpdatable  = []string{"name", "webhook_url", "event_types"}
	clientOutputOnly = []string{"id", "signing_secret", "previous_secret", "previous_secret_until", "create_time", "update_time", "etag",
		"disabled_time", "disabled_reason"}
)

// maskPaths resolves an update mask to the updatable fields it names. No mask at all, or
// "*", means every updatable field (AIP-134); a mask with no paths means none. Over REST the
// gateway always makes a mask, of the fields present in the body.
func maskPaths(m *fieldmaskpb.FieldMask, updatable, outputOnly []string) ([]string, error) {
	if m == nil {
		return updatable, nil
	}
	var out []string
	for _, p := range m.GetPaths() {
		top, _, _ := strings.Cut(p, ".")
		switch {
		case p == "": // the gateway's mask of an empty body
		case p == "*":
			return updatable, nil
		case slices.Contains(updatable, p):
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		case slices.Contains(outputOnly, top):
		default:
			return nil, fieldErr("update_mask", "%q cannot be updated; updatable: %s", p, strings.Join(updatable, ", "))
		}
	}
	return out, nil
}

func (c *clientService) UpdateClient(ctx context.Context, req *locksv1.UpdateClientRequest) (*locksv1.UpdateClientResponse, error) {
	in := req.GetClient()
	if in == nil {
		return nil, fieldErr("client", "required: the fields to change")
	}
	id := req.GetId()
	if id == "" {
		id = in.GetId()
	}
	if err := checkClientID("id", id); err != nil {
		return nil, err
	}
	if in.GetId() != "" && in.GetId() != id {
		return nil, fieldErr("id", "the body's id %q is not the id %q of the client being updated; an id cannot be changed", in.GetId(), id)
	}
	paths, err := maskPaths(req.GetUpdateMask(), clientUpdatable, clientOutputOnly)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		switch p {
		case "name":
			err = checkText("name", in.GetName(), maxNameLen)
		case "webhook_url":
			err = c.s.checkWebhookURL(ctx, in.GetWebhookUrl())
		case "event_types":
			err = checkEventTypes("event_types", in.GetEventTypes())
		}
		if err != nil {
			return nil, err
		}
	}
	var row clientRow
	err = pgx.BeginFunc(ctx, c.s.db, func(tx pgx.Tx) error {
		cur, err := c.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := checkEtag(ctx, "client", id, cur.etag(), in.GetEtag()); err != nil {
			return err
		}
		name, hook, types := cur.Name, cur.WebhookURL, cur.EventTypes
		if slices.Contains(paths, "event_types") {
			types = storedTypes(in.GetEventTypes())
		}
		if slices.Contains(paths, "name") {
			name = in.GetName()
		}
		if slices.Contains(paths, "webhook_url") {
			hook = in.GetWebhookUrl()
		}
		if len(paths) == 0 {
			row = cur // nothing to change: no new version
			return nil
		}
		row, err = scanClient(tx.QueryRow(ctx, `
			UPDATE clients AS c SET name = $2, webhook_url = $3, event_types = $4, version = c.version + 1, updated_at = now()
			WHERE c.id = $1 RETURNING `+clientCols, id, name, hook, types))
		if err != nil {
			return fmt.Errorf("update client: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.s.registryChanged(id)
	return &locksv1.UpdateClientResponse{Client: row.proto(true, time.Now())}, nil
}

func (c *clientService) DeleteClient(ctx context.Context, req *locksv1.DeleteClientRequest) (*locksv1.DeleteClientResponse, error) {
	id := req.GetId()
	if err := checkClientID("id", id); err != nil {
		return nil, err
	}
	err := pgx.BeginFunc(ctx, c.s.db, func(tx pgx.Tx) error {
		cur, err := c.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := checkEtag(ctx, "client", id, cur.etag(), req.GetEtag()); err != nil {
			return err
		}
		// Subscriptions go with it (ON DELETE CASCADE); the notifier reads the client afresh
		// before every attempt, so nothing more is sent to it.
		if _, err := tx.Exec(ctx, `DELETE FROM clients WHERE id = $1`, id); err != nil {
			return fmt.Errorf("delete client: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.s.registryChanged(id)
	return &locksv1.DeleteClientResponse{}, nil
}

func (c *clientService) RotateClientSecret(ctx context.Context, req *locksv1.RotateClientSecretRequest) (*locksv1.RotateClientSecretResponse, error) {
	id := req.GetId()
	if err := checkClientID("id", id); err != nil {
		return nil, err
	}
	overlap, err := rotationOverlap(req)
	if err != nil {
		return nil, err
	}
	secret, err := newSecret()
	if err != nil {
		return nil, err
	}
	var row clientRow
	err = pgx.BeginFunc(ctx, c.s.db, func(tx pgx.Tx) error {
		cur, err := c.get(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := checkEtag(ctx, "client", id, cur.etag(), req.GetEtag()); err != nil {
			return err
		}
		row, err = scanClient(tx.QueryRow(ctx, `
			UPDATE clients AS c SET previous_secret = c.signing_secret,
				previous_secret_until = now() + make_interval(secs => $3),
				signing_secret = $2, version = c.version + 1, updated_at = now()
			WHERE c.id = $1 RETURNING `+clientCols, id, secret, overlap.Seconds()))
		if err != nil {
			return fmt.Errorf("rotate secret: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.s.registryChanged(id)
	return &locksv1.RotateClientSecretResponse{Client: row.proto(true, time.Now())}, nil
}
