package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// The handlers return these (wrapped, or as the typed errors below); statusOf turns them into
// gRPC codes, and httpStatus turns codes into HTTP statuses. Nothing else picks a code.
var (
	// ErrInvalid marks a request that is wrong in itself (400 / INVALID_ARGUMENT).
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound marks a missing resource (404 / NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrExists marks a resource that exists already (409 / ALREADY_EXISTS).
	ErrExists = errors.New("already exists")
	// ErrStale marks an etag that is not the resource's current one (412 / FAILED_PRECONDITION).
	ErrStale = errors.New("stale etag")
	// ErrUnauthenticated marks a call without a valid bearer token (401 / UNAUTHENTICATED).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied marks a call the caller's token may not make (403 /
	// PERMISSION_DENIED): a client token outside its own client (authz.go).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnimplemented marks a call whose implementation is not there yet (501 / UNIMPLEMENTED).
	ErrUnimplemented = errors.New("not implemented")
)

// FieldError is an invalid request field; Field is its name as a REST caller writes it.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes a FieldError an ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// FieldErrors are several invalid fields of one request: every invalid item of a batch,
// each named (`requests[3].sensor.id`), so that a caller fixes them all at once.
type FieldErrors []*FieldError

// maxNamedInMessage bounds the items an error message names; its details name them all.
const maxNamedInMessage = 10

func (e FieldErrors) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d invalid field", len(e))
	if len(e) != 1 {
		b.WriteString("s")
	}
	for i, fe := range e {
		if i == maxNamedInMessage {
			fmt.Fprintf(&b, "; and %d more (every one is in the details)", len(e)-i)
			break
		}
		sep := "; "
		if i == 0 {
			sep = ": "
		}
		b.WriteString(sep + fe.Error())
	}
	return b.String()
}

// Unwrap makes FieldErrors an ErrInvalid.
func (e FieldErrors) Unwrap() error { return ErrInvalid }

// withPrefix is err with its field named from the request's root ("requests[3].sensor." +
// "id"), if it is a FieldError; other errors are returned as they are.
func withPrefix(prefix string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: prefix + fe.Field, Reason: fe.Reason}
	}
	return err
}

// BatchItem is one item of a batch: where it is in the request and the id it names.
type BatchItem struct {
	Field string // "requests[3].sensor.id"
	ID    string
}

// BatchError is a batch refused for items that exist already (Err ErrExists) or are
// missing (ErrNotFound): it names every one, so that the caller can drop or fix them.
type BatchError struct {
	Err   error  // ErrExists or ErrNotFound
	Kind  string // "sensor"
	Items []BatchItem
	Of    int // items in the batch
}

func (e *BatchError) Error() string {
	var b strings.Builder
	what := "already exist"
	if errors.Is(e.Err, ErrNotFound) {
		what = "not found"
	}
	fmt.Fprintf(&b, "%d of %d %ss %s; nothing was done:", len(e.Items), e.Of, e.Kind, what)
	for i, it := range e.Items {
		if i == maxNamedInMessage {
			fmt.Fprintf(&b, " and %d more (every one is in the details)", len(e.Items)-i)
			break
		}
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s %q", it.Field, it.ID)
	}
	return b.String()
}

// Unwrap makes a BatchError its Err.
func (e *BatchError) Unwrap() error { return e.Err }

// NotFoundError names the missing resource.
type NotFoundError struct {
	Kind string // "sensor", "client", "subscription", "state"
	ID   string
}

func (e *NotFoundError) Error() string {
	switch e.Kind {
	case "state":
		return fmt.Sprintf("sensor %q has no state: no reading of it was ever received", e.ID)
	case "subscription":
		return fmt.Sprintf("no subscription %s", e.ID)
	}
	return fmt.Sprintf("%s %q not found", e.Kind, e.ID)
}

// Unwrap makes a NotFoundError an ErrNotFound.
func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// ExistsError names the resource that exists already.
type ExistsError struct {
	Kind string
	ID   string
}

func (e *ExistsError) Error() string { return fmt.Sprintf("%s %q already exists", e.Kind, e.ID) }

// Unwrap makes an ExistsError an ErrExists.
func (e *ExistsError) Unwrap() error { return ErrExists }

// StaleError is a conditional change whose etag is not the resource's current one.
type StaleError struct {
	Kind string
	ID   string
	Etag string // the one the caller sent
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("%s %q has changed since etag %q: read it again and retry with its current etag", e.Kind, e.ID, e.Etag)
}

// Unwrap makes a StaleError an ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// statusOf is the one place where errors become gRPC codes. Anything it does not know is an
// internal error whose details stay in the log, not in the answer.
func statusOf(err error) (st *status.Status, internal bool) {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s, false
	}
	var fe *FieldError
	var fes FieldErrors
	var stale *StaleError
	var batch *BatchError
	switch {
	case errors.As(err, &fes):
		v := make([]*errdetails.BadRequest_FieldViolation, len(fes))
		for i, f := range fes {
			v[i] = &errdetails.BadRequest_FieldViolation{Field: f.Field, Description: f.Reason}
		}
		s := status.New(codes.InvalidArgument, err.Error())
		if d, derr := s.WithDetails(&errdetails.BadRequest{FieldViolations: v}); derr == nil {
			s = d
		}
		return s, false
	case errors.As(err, &batch):
		code, what := codes.AlreadyExists, "already exists"
		if errors.Is(batch.Err, ErrNotFound) {
			code, what = codes.NotFound, "not found"
		}
		s := status.New(code, err.Error())
		ds := make([]protoadapt.MessageV1, len(batch.Items))
		for i, it := range batch.Items {
			ds[i] = &errdetails.ResourceInfo{ResourceType: batch.Kind, ResourceName: it.ID, Description: it.Field + ": " + what}
		}
		if d, derr := s.WithDetails(ds...); derr == nil {
			s = d
		}
		return s, false
	case errors.As(err, &fe):
		s := status.New(codes.InvalidArgument, err.Error())
		if d, derr := s.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.Field, Description: fe.Reason},
		}}); derr == nil {
			s = d
		}
		return s, false
	case errors.Is(err, ErrInvalid):
		return status.New(codes.InvalidArgument, err.Error()), false
	case errors.As(err, &stale):
		s := status.New(codes.FailedPrecondition, err.Error())
		if d, derr := s.WithDetails(&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: "ETAG", Subject: stale.Kind + "/" + stale.ID, Description: "etag " + stale.Etag + " is not current"},
		}}); derr == nil {
			s = d
		}
		return s, false
	case errors.Is(err, ErrNotFound):
		return status.New(codes.NotFound, err.Error()), false
	case errors.Is(err, ErrExists):
		return status.New(codes.AlreadyExists, err.Error()), false
	case errors.Is(err, ErrUnauthenticated):
		return status.New(codes.Unauthenticated, err.Error()), false
	case errors.Is(err, ErrPermissionDenied):
		return status.New(codes.PermissionDenied, err.Error()), false
	case errors.Is(err, ErrUnimplemented):
		return status.New(codes.Unimplemented, err.Error()), false
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request canceled"), false
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded"), false
	}
	return status.New(codes.Internal, "internal error; the server log has the details"), true
}

// httpStatus is the HTTP status of a gRPC code: the gateway's mapping, except that a stale
// etag (the only FAILED_PRECONDITION this API returns) is 412 Precondition Failed.
func httpStatus(c codes.Code) int {
	if c == codes.FailedPrecondition {
		return http.StatusPreconditionFailed
	}
	return runtime.HTTPStatusFromCode(c)
}
