package main

import (
	"flag"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// configFlags registers on fs the flags of the configuration variables named (all of them
// when names is empty), so that a command's --help lists only the settings it reads. The
// returned map is config.Load's: every variable is still read from the environment.
func configFlags(fs *flag.FlagSet, names ...string) map[string]*string {
	if len(names) == 0 {
		return config.Register(fs)
	}
	all := flag.NewFlagSet("", flag.ContinueOnError)
	vals := config.Register(all)
	for _, env := range names {
		f := all.Lookup(config.FlagName(env))
		if f == nil {
			panic("configFlags: no variable " + env) // a programming error: the names are constants
		}
		// The same Value: setting the flag on fs sets the string vals[env] points to.
		fs.Var(f.Value, f.Name, f.Usage)
	}
	return vals
}

// commandSettings are the variables each command reads, beyond LOCKS_LOG_LEVEL and
// LOCKS_LOG_FORMAT; run and migrate read them all.
var commandSettings = map[string][]string{
	"loadgen": {"LOCKS_AMQP_URL", "LOCKS_AMQP_QUEUE", "LOCKS_HTTP_ADDR", "LOCKS_LOST_AFTER"},
	"replay": {"LOCKS_POSTGRES_URL", "LOCKS_CLICKHOUSE_URL", "LOCKS_CLICKHOUSE_CLUSTER", "LOCKS_NATS_URL", "LOCKS_NATS_LISTEN",
		"LOCKS_NATS_CREDS", "LOCKS_NATS_NKEY", "LOCKS_NATS_CA", "LOCKS_NATS_CERT", "LOCKS_NATS_KEY", "LOCKS_DATA_DIR", "LOCKS_PARTITIONS"},
	"publish": {"LOCKS_AMQP_URL", "LOCKS_AMQP_QUEUE"},
}

// settingsOf are the variables whose flags cmd takes: nil (all) for run and migrate.
func settingsOf(cmd string) []string {
	names, ok := commandSettings[cmd]
	if !ok {
		return nil
	}
	return append(append([]string(nil), names...), "LOCKS_LOG_LEVEL", "LOCKS_LOG_FORMAT")
}
