// Package redact makes URLs safe to print. Connection URLs (AMQP, Postgres, ClickHouse,
// NATS) carry passwords in their user info or query; webhook URLs often carry a receiver's
// token in their query. Logs, configuration errors and the attempt errors stored in the
// delivery history go through here instead of printing the URL as given.
package redact

import (
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// URL is raw with its password and the values of secret-looking query parameters
// (password, token, secret, key, …) masked. A user name without a password is masked too:
// nats://TOKEN@host carries a token there. raw may be a comma-separated list (NATS); an
// unparsable part keeps only its scheme and host-ish text, with anything before an "@" and
// after a "?" masked, since a password with a stray "/" or "#" is what makes it unparsable.
// A keyword/value connection string (Postgres's "host=h password=p") goes through DSN.
func URL(raw string) string {
	if isKeywordDSN(raw) {
		return DSN(raw)
	}
	if strings.Contains(raw, ",") {
		parts := strings.Split(raw, ",")
		for i, p := range parts {
			parts[i] = URL(p)
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Opaque != "" {
		return unparsable(raw)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if u.User.Username() != "" {
			u.User = url.User(Mask)
		}
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = Mask
		} else {
			for k := range q {
				if secretKey(k) {
					q[k] = []string{Mask}
				}
			}
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

func secretKey(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"pass", "pwd", "secret", "token", "key", "auth", "cred"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// isKeywordDSN says raw is a keyword/value connection string rather than a URL.
func isKeywordDSN(raw string) bool {
	raw = strings.TrimSpace(raw)
	return !strings.Contains(raw, "://") && strings.Contains(raw, "=")
}

// DSN is a keyword/value connection string (libpq's "host=h user=u password='p q'") with
// the values of secret-looking keywords (password, sslpassword, …) masked; what cannot be
// read as keywords and values is masked whole.
func DSN(raw string) string {
	var out []string
	s := strings.TrimSpace(raw)
	for s != "" {
		k, rest, ok := strings.Cut(s, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t'") {
			return Mask
		}
		rest = strings.TrimLeft(rest, " \t")
		var v string
		if strings.HasPrefix(rest, "'") {
			// A quoted value ends at the next quote not escaped with a backslash.
			i, esc := 1, false
			for ; i < len(rest); i++ {
				if esc {
					esc = false
				} else if rest[i] == '\\' {
					esc = true
				} else if rest[i] == '\'' {
					break
				}
			}
			if i >= len(rest) {
				return Mask
			}
			v, s = rest[:i+1], rest[i+1:]
		} else {
			i := strings.IndexAny(rest, " \t")
			if i < 0 {
				i = len(rest)
			}
			v, s = rest[:i], rest[i:]
		}
		s = strings.TrimLeft(s, " \t")
		if secretKey(k) {
			v = Mask
		}
		out = append(out, k+"="+v)
	}
	return strings.Join(out, " ")
}

// HostOnly is raw reduced to its scheme and host, with a non-empty path shown as Mask: for
// URLs whose path is itself a secret (the operator's alert webhook: chat services put the
// token in the path).
func HostOnly(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return Mask
	}
	out := u.Scheme + "://" + u.Host
	if u.Path != "" && u.Path != "/" {
		out += "/" + Mask
	}
	return out
}

// In is text with every secret that raw (a URL, a list of them or a keyword/value string)
// carries masked: for errors of libraries that quote the connection string they failed on.
func In(text, raw string) string {
	if strings.TrimSpace(raw) == "" {
		return text
	}
	text = strings.ReplaceAll(text, raw, URL(raw))
	for _, sec := range secretsOf(raw)[1:] {
		if len(sec) >= 3 {
			text = strings.ReplaceAll(text, sec, Mask)
		}
	}
	return text
}

// secretsOf lists raw, then what URL and DSN mask in it.
func secretsOf(raw string) []string {
	out := []string{raw}
	if isKeywordDSN(raw) {
		for _, f := range strings.Fields(raw) {
			if k, v, ok := strings.Cut(f, "="); ok && secretKey(k) {
				out = append(out, strings.Trim(v, "'"))
			}
		}
		return out
	}
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		out = append(out, part)
		_, rest, _ := strings.Cut(part, "://")
		if i := strings.LastIndexByte(rest, '@'); i >= 0 {
			userinfo := rest[:i]
			out = append(out, userinfo)
			if user, pw, ok := strings.Cut(userinfo, ":"); ok {
				out = append(out, pw, url.PathEscape(pw))
				if uq, err := url.PathUnescape(pw); err == nil {
					out = append(out, uq)
				}
			} else if len(user) >= 16 {
				// A user name alone is a token when it is long (nats://TOKEN@host); a short
				// one ("postgres") would mask every mention of the word.
				out = append(out, user)
			}
		}
		if u, err := url.Parse(part); err == nil {
			for k, vs := range u.Query() {
				if secretKey(k) {
					out = append(out, vs...)
				}
			}
		}
	}
	// Longest first, so that a secret is masked whole before a part of it.
	rest := out[1:]
	slices.SortFunc(rest, func(a, b string) int { return len(b) - len(a) })
	return out
}

// Error is err with In applied to its text; errors.Is and errors.As still see err.
func Error(err error, raw string) error {
	if err == nil {
		return nil
	}
	return &redacted{err: err, text: In(err.Error(), raw)}
}

type redacted struct {
	err  error
	text string
}

func (r *redacted) Error() string { return r.text }
func (r *redacted) Unwrap() error { return r.err }

func unparsable(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		scheme, rest = "", raw
	} else {
		scheme += "://"
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = Mask + rest[i:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i] + "?" + Mask
	}
	return scheme + rest
}

// WebhookURL is raw without user info, query and fragment: what is left (scheme, host,
// path) says which receiver it is, and a token the receiver put in its URL stays out of
// logs and of the attempt errors shown in the delivery history.
func WebhookURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		s := raw
		if i := strings.IndexAny(s, "?#"); i >= 0 {
			s = s[:i]
		}
		return unparsable(s)
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// HostOnlyError is err with everything but the scheme and host of raw masked in its text
// (HostOnly's counterpart for errors: Go's HTTP client quotes the URL with its path).
func HostOnlyError(err error, raw string) error {
	if err == nil {
		return nil
	}
	text := In(err.Error(), raw)
	if u, perr := url.Parse(strings.TrimSpace(raw)); perr == nil {
		for _, p := range []string{u.EscapedPath(), u.Path, u.RawQuery} {
			if len(p) > 1 {
				text = strings.ReplaceAll(text, p, "/"+Mask)
			}
		}
	}
	return &redacted{err: err, text: text}
}

// publicError is an error whose text anyone may read.
type publicError struct{ error }

func (e publicError) Unwrap() error { return e.error }

// Public marks err as safe to show to anyone (on /readyz without a token): its text names
// no host, user or credential, only the state and the way out (a checkpoint ahead of its
// stream, say).
func Public(err error) error {
	if err == nil {
		return nil
	}
	return publicError{err}
}

// IsPublic reports whether err, or an error it wraps, was marked by Public.
func IsPublic(err error) bool {
	var pe publicError
	return errors.As(err, &pe)
}
