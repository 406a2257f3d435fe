package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	locksv1 "github.com/lock-sensors/lock-sensors/proto/locks/v1"
)

// Client tokens: bearer tokens bound to one client (docs/contract.md section 3). A token is
// `lsct_` and the base64url of 32 random bytes, recognisable in a leaked log or a secret
// scanner; the server keeps only its SHA-256 (client_tokens.hash).
//
// Every call with a client token looks its hash up in Postgres, without a cache: a deleted
// token is refused by every API instance from the next call on. The look-up is one
// primary-key-sized index probe. last_used_at is written at most once per touchEvery per
// token and instance (tokenTouches), so that a busy token does not write a row per call.

const clientTokenPrefix = "lsct_"

// touchEvery is how often, at most, an instance records that a token was used.
const touchEvery = time.Minute

func newClientToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return clientTokenPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

func newTokenID() (string, error) {
	b := make([]byte, 13)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random id: %w", err)
	}
	return "tok_" + idEncoding.EncodeToString(b)[:20], nil
}

// tokenTouches remembers when this instance last wrote each token's last_used_at.
type tokenTouches struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// due reports whether tokenID's use at now should be written, and if so notes it as written.
func (t *tokenTouches) due(tokenID string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil || len(t.last) > 100_000 {
		t.last = make(map[string]time.Time) // bounded: forgetting costs one more write per token
	}
	if at, ok := t.last[tokenID]; ok && now.Sub(at) < touchEvery {
		return false
	}
	t.last[tokenID] = now
	return true
}

// bearer is the token of an authorization value ("Bearer <token>").
func bearer(authorization string) (string, error) {
	if authorization == "" {
		return "", fmt.Errorf("%w: missing bearer token; send the header Authorization: Bearer <token> (gRPC metadata authorization)", ErrUnauthenticated)
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", fmt.Errorf("%w: the authorization must be \"Bearer <token>\"", ErrUnauthenticated)
	}
	return strings.TrimSpace(token), nil
}

// authenticate says who makes a call: an administrator (a token of LOCKS_API_TOKENS) or the
// client of a client token.
func (s *Server) authenticate(ctx context.Context, authorization string) (principal, error) {
	if s.auth.check(authorization) == nil {
		return principal{admin: true}, nil
	}
	token, err := bearer(authorization)
	if err != nil || !strings.HasPrefix(token, clientTokenPrefix) {
		return principal{}, s.auth.check(authorization) // the administrator check's reason
	}
	sum := sha256.Sum256([]byte(token))
	var p principal
	err = s.db.QueryRow(ctx, `SELECT id, client_id FROM client_tokens WHERE hash = $1`, sum[:]).Scan(&p.tokenID, &p.clientID)
	if errors.Is(err, pgx.ErrNoRows) {
		return principal{}, fmt.Errorf("%w: the client token is not known: it was deleted, or mistyped", ErrUnauthenticated)
	}
	if err != nil {
		return principal{}, fmt.Errorf("authenticate client token: %w", err)
	}
	if s.touches.due(p.tokenID, time.Now()) {
		if _, err := s.db.Exec(ctx, `UPDATE client_tokens SET last_used_at = now() WHERE id = $1`, p.tokenID); err != nil {
			s.log.WarnContext(ctx, "record client token use", "token_id", p.tokenID, "err", err)
		}
	}
	return p, nil
}

type tokenService struct {
	locksv1.UnimplementedClientTokenServiceServer
	s *Server
}

func (t *tokenService) clientExists(ctx context.Context, id string) error {
	if err := checkClientID("client_id", id); err != nil {
		return err
	}
	var ok bool
	if err := t.s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM clients WHERE id = $1)`, id).Scan(&ok); err != nil {
		return fmt.Errorf("read client: %w", err)
	}
	if !ok {
		return &NotFoundError{Kind: "client", ID: id}
	}
	return nil
}

func (t *tokenService) CreateClientToken(ctx context.Context, req *locksv1.CreateClientTokenRequest) (*locksv1.CreateClientTokenResponse, error) {
	if err := checkText("name", req.GetName(), maxNameLen); err != nil {
		return nil, err
	}
	token, err := newClientToken()
	if err != nil {
		return nil, err
	}
	id, err := newTokenID()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(token))
	var created time.Time
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	err = pgx.BeginFunc(ctx, t.s.db, func(tx pgx.Tx) error {
		// FOR SHARE: the client cannot be deleted between the check and the insert.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM clients WHERE id = $1 FOR SHARE) c`, req.GetClientId()).Scan(&n); err != nil {
			return fmt.Errorf("read client: %w", err)
		}
		if n == 0 {
			return &NotFoundError{Kind: "client", ID: req.GetClientId()}
		}
		return tx.QueryRow(ctx, `INSERT INTO client_tokens (id, client_id, name, hash) VALUES ($1, $2, $3, $4) RETURNING created_at`,
			id, req.GetClientId(), req.GetName(), sum[:]).Scan(&created)
	})
	if err != nil {
		return nil, err
	}
	return &locksv1.CreateClientTokenResponse{TokenId: id, Token: token, ClientToken: &locksv1.ClientToken{
		TokenId: id, ClientId: req.GetClientId(), Name: req.GetName(), CreateTime: timestamppb.New(created),
	}}, nil
}

func (t *tokenService) ListClientTokens(ctx context.Context, req *locksv1.ListClientTokensRequest) (*locksv1.ListClientTokensResponse, error) {
	if err := t.clientExists(ctx, req.GetClientId()); err != nil {
		return nil, err
	}
	rows, err := t.s.db.Query(ctx, `SELECT id, name, created_at, last_used_at FROM client_tokens WHERE client_id = $1 ORDER BY created_at, id`, req.GetClientId())
	if err != nil {
		return nil, fmt.Errorf("list client tokens: %w", err)
	}
	defer rows.Close()
	out := &locksv1.ListClientTokensResponse{Tokens: []*locksv1.ClientToken{}}
	for rows.Next() {
		var id, name string
		var created time.Time
		var used *time.Time
		if err := rows.Scan(&id, &name, &created, &used); err != nil {
			return nil, fmt.Errorf("list client tokens: %w", err)
		}
		ct := &locksv1.ClientToken{TokenId: id, ClientId: req.GetClientId(), Name: name, CreateTime: timestamppb.New(created)}
		if used != nil {
			ct.LastUsedTime = timestamppb.New(*used)
		}
		out.Tokens = append(out.Tokens, ct)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list client tokens: %w", err)
	}
	return out, nil
}

func (t *tokenService) DeleteClientToken(ctx context.Context, req *locksv1.DeleteClientTokenRequest) (*locksv1.DeleteClientTokenResponse, error) {
	if err := checkClientID("client_id", req.GetClientId()); err != nil {
		return nil, err
	}
	if req.GetTokenId() == "" {
		return nil, fieldErr("token_id", "required")
	}
	tag, err := t.s.db.Exec(ctx, `DELETE FROM client_tokens WHERE client_id = $1 AND id = $2`, req.GetClientId(), req.GetTokenId())
	if err != nil {
		return nil, fmt.Errorf("delete client token: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil, &NotFoundError{Kind: "client token", ID: req.GetTokenId()}
	}
	return &locksv1.DeleteClientTokenResponse{}, nil
}

// wellFormedClientToken says whether token has the form newClientToken gives: the prefix and
// 43 base64url characters (32 random bytes). Only its form: whether it is known is a look-up.
func wellFormedClientToken(token string) bool {
	rest, ok := strings.CutPrefix(token, clientTokenPrefix)
	if !ok || len(rest) != base64.RawURLEncoding.EncodedLen(32) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(rest)
	return err == nil
}

// ClientOfToken is the client whose client token token is: the dashboard signs a client's
// people in with it (ui.ClientTokens). A token that is not a known client token (an
// administrator token included) is ErrUnauthenticated; a deleted one is from its next use on.
func (s *Server) ClientOfToken(ctx context.Context, token string) (string, error) {
	if !wellFormedClientToken(token) {
		return "", fmt.Errorf("%w: not a client token", ErrUnauthenticated)
	}
	p, err := s.authenticate(ctx, "Bearer "+token)
	if err != nil {
		return "", err
	}
	if p.admin || p.clientID == "" {
		return "", fmt.Errorf("%w: not a client token", ErrUnauthenticated)
	}
	return p.clientID, nil
}
