package redact_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"amqp://guest:hunter2@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://postgres@127.0.0.1:5432/locks?sslmode=disable", "postgres://xxxxx@127.0.0.1:5432/locks?sslmode=disable"},
		{"postgres://u@h/db?password=hunter2&sslmode=require", "postgres://xxxxx@h/db?password=xxxxx&sslmode=require"},
		{"clickhouse://default:hunter2@h:9000/locks", "clickhouse://default:xxxxx@h:9000/locks"},
		{"nats://a:hunter2@h1:4222, nats://b:hunter2@h2:4222", "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222"},
		{"nats://tok-hunter2@h:4222", "nats://xxxxx@h:4222"}, // a user name alone may be a token
		{"nats://tok-hunter2@h1:4222,nats://tok-hunter2@h2:4222", "nats://xxxxx@h1:4222,nats://xxxxx@h2:4222"},
		{"host=127.0.0.1 port=5432 user=locks password=hunter2 dbname=locks", "host=127.0.0.1 port=5432 user=locks password=xxxxx dbname=locks"},
		{"host=h password='hun ter\\'2' sslpassword=hunter2 dbname=x", "host=h password=xxxxx sslpassword=xxxxx dbname=x"},
		{"host=h password='unterminated", "xxxxx"},
		// Unparsable: a password with a "/" or "#" in it.
		{"amqp://guest:hun/ter2@h:5672/", "amqp://xxxxx@h:5672/"},
		{"postgres://u:hun#ter2@h/db", "postgres://xxxxx@h/db"},
		{"postgres://u:p@h:x/db?password=hunter2", "postgres://xxxxx@h:x/db?xxxxx"},
	} {
		if got := redact.URL(c.in); got != c.want {
			t.Errorf("URL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestWebhookURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"https://hooks.example.com/in/abc?token=hunter2", "https://hooks.example.com/in/abc"},
		{"https://u:hunter2@hooks.example.com/x#hunter2", "https://hooks.example.com/x"},
		{"https://hooks.example.com/x?", "https://hooks.example.com/x"},
		{"http://[::1/x?token=hunter2", "http://[::1/x"},
	} {
		got := redact.WebhookURL(c.in)
		if got != c.want || strings.Contains(got, "hunter2") {
			t.Errorf("WebhookURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Libraries quote the connection string they failed on: In masks the secrets of each form
// wherever they appear in an error's text.
func TestIn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, text string }{
		{"clickhouse://default:hunter2@127.0.0.1:x/locks", `parse "clickhouse://default:hunter2@127.0.0.1:x/locks": invalid port ":x" after host`},
		{"nats://hunter2-token-0123456789@127.0.0.1:4222", "dial nats://hunter2-token-0123456789@127.0.0.1:4222: connection refused"},
		{"host=h user=u password=hunter2 port=x", "cannot parse `host=h user=u password=hunter2 port=x`: invalid port (password hunter2)"},
		{"postgres://u:hun%2Fter2@h/db", "failed to connect to `user=u password=hun/ter2`"},
	} {
		got := redact.In(c.text, c.raw)
		if strings.Contains(got, "hunter2") || strings.Contains(got, "hun/ter2") {
			t.Errorf("In(%q) = %q: the secret shows", c.text, got)
		}
		if err := redact.Error(errors.New(c.text), c.raw); strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Error(%q) = %q", c.text, err)
		}
	}
	base := errors.New("base")
	if !errors.Is(redact.Error(base, "amqp://u:p@h/"), base) {
		t.Error("Error hides its cause from errors.Is")
	}
}

// The operator's alert webhook keeps its token in the path (chat services do): HostOnly
// shows the scheme and host only.
func TestHostOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"https://hooks.example.com/services/T0/B0/hunter2", "https://hooks.example.com/xxxxx"},
		{"https://u:hunter2@hooks.example.com/?token=hunter2", "https://hooks.example.com"},
		{"https://[::1/hunter2", "xxxxx"},
	} {
		if got := redact.HostOnly(c.in); got != c.want {
			t.Errorf("HostOnly(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestHostOnlyError(t *testing.T) {
	t.Parallel()
	raw := "https://hooks.example.com/services/T0/hunter2?token=hunter3"
	err := redact.HostOnlyError(errors.New(`Post "https://hooks.example.com/services/T0/hunter2?token=hunter3": dial tcp: refused`), raw)
	if strings.Contains(err.Error(), "hunter") {
		t.Fatalf("HostOnlyError: %v", err)
	}
}

func TestPublic(t *testing.T) {
	t.Parallel()
	plain := errors.New("dial tcp 10.0.0.5:5432: refused")
	if redact.IsPublic(plain) || redact.Public(nil) != nil {
		t.Fatal("an unmarked error is public, or Public(nil) is not nil")
	}
	if err := fmt.Errorf("state: %w", redact.Public(errors.New("checkpoint ahead of READINGS"))); !redact.IsPublic(err) {
		t.Fatalf("%v: a wrapped public error is not public", err)
	}
}
