package alerter

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/smtp"
	"net/url"
	"strings"
	"time"
)

// smtpTarget is a parsed LOCKS_ALERT_SMTP_URL.
type smtpTarget struct {
	addr, host  string
	user, pass  string
	implicitTLS bool
	// plain allows a session without TLS (?tls=none): otherwise a server that does not offer
	// STARTTLS, or a network that strips the offer, gets nothing, not even the login.
	plain bool
}

// parseSMTPURL reads smtp://[user:pass@]host[:port][?tls=starttls|none] (port 25; STARTTLS
// required unless tls=none says the server may be spoken to in the clear) or
// smtps://…[:port] (port 465, TLS from the start).
func parseSMTPURL(raw string) (smtpTarget, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return smtpTarget{}, errors.New("not a URL") // the URL may hold a password: not repeated
	}
	var t smtpTarget
	port := ""
	switch u.Scheme {
	case "smtp":
		port = "25"
	case "smtps":
		port, t.implicitTLS = "465", true
	default:
		return smtpTarget{}, fmt.Errorf("scheme %q: want smtp or smtps", u.Scheme)
	}
	t.host = u.Hostname()
	if t.host == "" {
		return smtpTarget{}, errors.New("no host")
	}
	if u.Port() != "" {
		port = u.Port()
	}
	t.addr = net.JoinHostPort(t.host, port)
	switch mode := u.Query().Get("tls"); {
	case mode == "" || mode == "starttls":
	case mode == "none" && !t.implicitTLS:
		t.plain = true
	default:
		return smtpTarget{}, fmt.Errorf("tls=%q: want starttls (the default) or none (smtp:// only)", mode)
	}
	if u.User != nil {
		t.user = u.User.Username()
		t.pass, _ = u.User.Password()
	}
	return t, nil
}

// emailMessage is the RFC 5322 message of notice n. Its Message-ID is the notice's id, the
// same on every attempt, so that a notice sent twice (a crash between the server's accept
// and the sent mark) can be recognised.
func (a *Alerter) emailMessage(n notice, now time.Time) []byte {
	state := "FIRING"
	if n.event == eventResolved {
		state = "RESOLVED"
	}
	var b bytes.Buffer
	h := func(k, v string) { fmt.Fprintf(&b, "%s: %s\r\n", k, v) }
	h("From", a.cfg.EmailFrom)
	h("To", strings.Join(a.cfg.EmailTo, ", "))
	h("Subject", mime.QEncoding.Encode("utf-8", fmt.Sprintf("[lock-sensors] %s %s %s", state, n.kind, n.subject)))
	h("Date", now.Format(time.RFC1123Z))
	h("Message-ID", "<"+n.noticeID()+"@lock-sensors>")
	h("MIME-Version", "1.0")
	h("Content-Type", "text/plain; charset=utf-8")
	h("Content-Transfer-Encoding", "8bit")
	b.WriteString("\r\n")
	body := fmt.Sprintf("%s: %s\n\nkind: %s\nsubject: %s\nfired at: %s\n", state, n.summary, n.kind, n.subject, n.firedAt.UTC().Format(time.RFC3339))
	if n.resolvedAt != nil {
		body += "resolved at: " + n.resolvedAt.UTC().Format(time.RFC3339) + "\n"
	}
	var details bytes.Buffer
	if json.Indent(&details, n.details, "", "  ") == nil {
		body += "\ndetails:\n" + details.String() + "\n"
	}
	body += "\nrunbook: " + RunbookURL(n.kind) + "\nGET /v1/alerts lists the alerts.\n"
	b.WriteString(strings.ReplaceAll(body, "\n", "\r\n"))
	return b.Bytes()
}

// sendEmail hands notice n to the SMTP server; nil only once the server accepted it.
func (a *Alerter) sendEmail(ctx context.Context, n notice) error {
	t, err := parseSMTPURL(a.cfg.SMTPURL)
	if err != nil {
		return err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return fmt.Errorf("smtp: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if t.implicitTLS {
		conn = tls.Client(conn, &tls.Config{ServerName: t.host})
	}
	c, err := smtp.NewClient(conn, t.host)
	if err != nil {
		return fmt.Errorf("smtp: %w", err)
	}
	defer c.Close()
	if !t.implicitTLS {
		ok, _ := c.Extension("STARTTLS")
		switch {
		case ok:
			if err := c.StartTLS(&tls.Config{ServerName: t.host}); err != nil {
				return fmt.Errorf("smtp STARTTLS: %w", err)
			}
		case !t.plain:
			// Sending anyway would show the login and the alerts to whoever stripped the offer.
			return errors.New("smtp: the server does not offer STARTTLS; use smtps://, or add ?tls=none to LOCKS_ALERT_SMTP_URL to send in the clear")
		}
	}
	if t.user != "" {
		// net/smtp refuses PLAIN over an unencrypted connection except to localhost.
		if err := c.Auth(smtp.PlainAuth("", t.user, t.pass, t.host)); err != nil {
			return fmt.Errorf("smtp auth: %w", err)
		}
	}
	from, _ := mailAddress(a.cfg.EmailFrom)
	if err := c.Mail(from); err != nil {
		return fmt.Errorf("smtp MAIL FROM: %w", err)
	}
	for _, to := range a.cfg.EmailTo {
		addr, _ := mailAddress(to)
		if err := c.Rcpt(addr); err != nil {
			return fmt.Errorf("smtp RCPT TO %s: %w", addr, err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	if _, err := w.Write(a.emailMessage(n, time.Now())); err != nil {
		return fmt.Errorf("smtp DATA: %w", err)
	}
	// Close waits for the server's reply to the message: its acceptance.
	if err := w.Close(); err != nil {
		return fmt.Errorf("smtp: message not accepted: %w", err)
	}
	_ = c.Quit()
	return nil
}
