package redact_test

import (
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"amqp://guest:hunter2@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://postgres@127.0.0.1:5432/locks?sslmode=disable", "postgres://postgres@127.0.0.1:5432/locks?sslmode=disable"},
		{"postgres://u@h/db?password=hunter2&sslmode=require", "postgres://u@h/db?password=xxxxx&sslmode=require"},
		{"clickhouse://default:hunter2@h:9000/locks", "clickhouse://default:xxxxx@h:9000/locks"},
		{"nats://a:hunter2@h1:4222, nats://b:hunter2@h2:4222", "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222"},
		{"nats://tok-hunter2@h:4222", "nats://tok-hunter2@h:4222"}, // a user name alone is no password
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
