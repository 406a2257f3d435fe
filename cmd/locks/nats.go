package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/lock-sensors/lock-sensors/internal/config"
	"github.com/lock-sensors/lock-sensors/internal/natsx"
	"github.com/lock-sensors/lock-sensors/internal/redact"
)

// dialNATS connects to url with the credentials of cfg. embedded says url is the embedded
// server of cfg.DataDir: then, unless LOCKS_NATS_NKEY or LOCKS_NATS_CREDS names another,
// its own credential from the data dir is used.
func dialNATS(cfg config.Config, url, name string, embedded bool, log *slog.Logger) (*nats.Conn, error) {
	auth := cfg.NATSAuth
	if embedded && auth.Nkey == "" && auth.Creds == "" {
		auth = natsx.EmbeddedAuth(cfg.DataDir)
		if _, err := os.Stat(auth.Nkey); errors.Is(err, fs.ErrNotExist) {
			return nil, &config.Error{Var: "LOCKS_DATA_DIR", Value: cfg.DataDir, Reason: "no embedded NATS credential " + auth.Nkey +
				": give the data dir of the `locks run` whose server listens on LOCKS_NATS_LISTEN, or LOCKS_NATS_NKEY"}
		}
	}
	opts, err := auth.Options()
	if err != nil {
		return nil, &config.Error{Var: "LOCKS_NATS_CREDS/NKEY/CA/CERT/KEY", Value: "(files)", Reason: err.Error()}
	}
	nc, err := natsx.Connect(url, name, log, opts...)
	if err != nil {
		return nil, fmt.Errorf("LOCKS_NATS_URL=%s: %w", redact.URL(url), err)
	}
	return nc, nil
}
