package natsx

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ProcessesBucket is the process registry (internal/procs): one key per running `locks`
// process, refreshed every few seconds and deleted on a clean stop.
const ProcessesBucket = "processes"

// ProcessesTTL drops the key of a process that died without deleting it a day later: long
// enough for alerts and the dashboard to show it as "stopped reporting".
const ProcessesTTL = 24 * time.Hour

// LogsStream keeps the warnings and errors of every process (internal/procs): locks.logs.<process>.
const LogsStream = "LOGS"

// LogsMaxMsgs bounds LOGS: a flood of errors drops the oldest, never fills the disk.
const LogsMaxMsgs = 5000

// LogsSubject is where process id publishes its warnings and errors.
func LogsSubject(processID string) string { return "locks.logs." + processID }

func processesConfig(c StreamsConfig) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      ProcessesBucket,
		Description: "one key per running locks process: its parts, version, address (internal/procs)",
		History:     1,
		TTL:         ProcessesTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
	}
}

func logsConfig(c StreamsConfig) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        LogsStream,
		Description: "warnings and errors of every locks process, for the dashboard (internal/procs)",
		Subjects:    []string{"locks.logs.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     LogsMaxMsgs,
		MaxMsgSize:  16 << 10,
		Replicas:    c.Replicas,
	}
}
