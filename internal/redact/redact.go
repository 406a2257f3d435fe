// Package redact makes URLs safe to print. Connection URLs (AMQP, Postgres, ClickHouse,
// NATS) carry passwords in their user info or query; webhook URLs often carry a receiver's
// token in their query. Logs, configuration errors and the attempt errors stored in the
// delivery history go through here instead of printing the URL as given.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

// URL is raw with its password and the values of secret-looking query parameters
// (password, token, secret, key, …) masked. raw may be a comma-separated list (NATS); an
// unparsable part keeps only its scheme and host-ish text, with anything before an "@" and
// after a "?" masked, since a password with a stray "/" or "#" is what makes it unparsable.
func URL(raw string) string {
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
