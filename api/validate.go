package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lock-sensors/lock-sensors/internal/event"
	"github.com/lock-sensors/lock-sensors/internal/netguard"
)

// Limits of docs/contract.md section 3 and of this API.
const (
	maxNameLen       = 200
	maxAddressLen    = 512
	maxWebhookURLLen = 2048
	maxClientIDLen   = 64
	minLostAfter     = time.Second
	maxLostAfter     = 365 * 24 * time.Hour
	defaultPageSize  = 100
	maxPageSize      = 1000
	resolveTimeout   = 3 * time.Second
)

// checkSensorID accepts 1 to 16 ASCII letters and digits, as the readings do.
func checkSensorID(field, id string) error {
	if id == "" {
		return fieldErr(field, "required: 1 to %d ASCII letters and digits", event.MaxSensorID)
	}
	if len(id) > event.MaxSensorID {
		return fieldErr(field, "%d characters; a sensor id has 1 to %d ASCII letters and digits", utf8.RuneCountInString(id), event.MaxSensorID)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return fieldErr(field, "%q is not a sensor id: only ASCII letters and digits are allowed", id)
		}
	}
	return nil
}

// checkClientID accepts what a client id can look like; the server makes them `cl_` + 20
// characters, but anything of this shape is simply looked up (and not found).
func checkClientID(field, id string) error {
	if id == "" {
		return fieldErr(field, "required")
	}
	if len(id) > maxClientIDLen {
		return fieldErr(field, "too long to be a client id")
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fieldErr(field, "%q is not a client id", id)
		}
	}
	return nil
}

// checkText accepts a non-blank text of at most max characters without control characters.
func checkText(field, v string, max int) error {
	if strings.TrimSpace(v) == "" {
		return fieldErr(field, "required: 1 to %d characters, not only spaces", max)
	}
	if !utf8.ValidString(v) {
		return fieldErr(field, "not valid UTF-8")
	}
	if n := utf8.RuneCountInString(v); n > max {
		return fieldErr(field, "%d characters; at most %d are allowed", n, max)
	}
	if strings.IndexFunc(v, unicode.IsControl) >= 0 {
		return fieldErr(field, "control characters (such as newlines or tabs) are not allowed")
	}
	if i := strings.IndexFunc(v, invisible); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return fieldErr(field, "invisible formatting character U+%04X (bidirectional override, zero-width or similar) is not allowed", r)
	}
	return nil
}

// invisible says r is a format character (Unicode Cf: bidirectional overrides and isolates,
// zero-width space and joiners, the byte-order mark, …) or a line or paragraph separator:
// they make a name or an address display as something else than it is (a reversed
// extension, two sensors' addresses that look equal), in the dashboard, the CLI and the
// webhook bodies.
func invisible(r rune) bool {
	return unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// checkLostAfter accepts an unset value (the server default) or 1s to 365 days.
func checkLostAfter(d *durationpb.Duration) (*int64, error) {
	if d == nil {
		return nil, nil
	}
	if err := d.CheckValid(); err != nil {
		return nil, fieldErr("lost_after", "not a valid duration")
	}
	v := d.AsDuration()
	if v < minLostAfter || v > maxLostAfter {
		return nil, fieldErr("lost_after", "%s is out of range: from %s to %s", v, minLostAfter, maxLostAfter)
	}
	ms := v.Milliseconds()
	return &ms, nil
}

// pageSize applies the default and the maximum (a larger size is lowered, as AIP-158 says).
func pageSize(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, fieldErr("page_size", "must not be negative")
	case n == 0:
		return defaultPageSize, nil
	case n > maxPageSize:
		return maxPageSize, nil
	}
	return int(n), nil
}

// timeRange checks the optional start_time and end_time of a request; an unset one is the
// zero time.
func timeRange(start, end *timestamppb.Timestamp) (from, to time.Time, err error) {
	for _, t := range []struct {
		field string
		ts    *timestamppb.Timestamp
		dst   *time.Time
	}{{"start_time", start, &from}, {"end_time", end, &to}} {
		if t.ts == nil {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return from, to, fieldErr(t.field, "not a valid time")
		}
		*t.dst = t.ts.AsTime()
	}
	return from, to, nil
}

// Resolver looks up the addresses of a host name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// checkWebhookURL accepts an absolute http or https URL without user info. Unless private
// addresses are allowed, its host must be a public address or a name that resolves only to
// public addresses (netguard.Reason). The notifier checks again when it connects: DNS may change.
func checkWebhookURL(ctx context.Context, raw string, allowPrivate bool, r Resolver) error {
	const field = "webhook_url"
	if raw == "" {
		return fieldErr(field, "required: an absolute http or https URL")
	}
	if len(raw) > maxWebhookURLLen {
		return fieldErr(field, "%d characters; at most %d are allowed", len(raw), maxWebhookURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fieldErr(field, "not a URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fieldErr(field, "must be an absolute http or https URL (got scheme %q)", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" {
		return fieldErr(field, "must be an absolute URL with a host, like https://example.com/hook")
	}
	if u.User != nil {
		return fieldErr(field, "must not contain user info (user:password@); authenticate the webhook with its signature")
	}
	if u.Fragment != "" || strings.HasSuffix(raw, "#") {
		return fieldErr(field, "must not contain a fragment (#…)")
	}
	host := u.Hostname()
	if host == "" {
		return fieldErr(field, "must have a host")
	}
	if p := u.Port(); p != "" {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 {
			return fieldErr(field, "port %q is out of range", p)
		}
	}
	if allowPrivate {
		return nil
	}
	const allow = "; set LOCKS_WEBHOOK_ALLOW_PRIVATE=true to allow such hosts"
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if why := netguard.Reason(a); why != "" {
			return fieldErr(field, "host %s is not a public address: %s%s", host, why, allow)
		}
		return nil
	}
	lower := strings.ToLower(strings.TrimSuffix(host, "."))
	if lower == "localhost" || strings.HasSuffix(lower, ".localhost") {
		return fieldErr(field, "host %s is a loopback name%s", host, allow)
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := r.LookupNetIP(rctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return fieldErr(field, "host %s does not resolve", host)
		}
		return fieldErr(field, "host %s could not be resolved: %v", host, err)
	}
	for _, a := range addrs {
		if why := netguard.Reason(a); why != "" {
			return fieldErr(field, "host %s resolves to %s, not a public address: %s%s", host, a.Unmap(), why, allow)
		}
	}
	return nil
}
