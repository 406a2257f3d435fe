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

// ProcessAll is the key prefix of a process that runs several parts (it connects with a user
// allowed everything, such as the embedded server's own).
const ProcessAll = "all"

// ProcessPart is the key prefix of a process running targets: its part when it runs one,
// ProcessAll otherwise.
func ProcessPart(targets []string) string {
	if len(targets) == 1 {
		return targets[0]
	}
	return ProcessAll
}

// ProcessKey is the registry key of process id running part (ProcessPart): "<part>.<id>", so
// that a part's NATS user may write the keys of its own part's processes only
// ($KV.processes.<part>.*), and a reader can tell a key its part did not write.
func ProcessKey(part, id string) string { return part + "." + id }

// LogsStream keeps the warnings and errors of every process (internal/procs):
// locks.logs.<part>.<process> (locks.logs.<process> before the per-part keys).
const LogsStream = "LOGS"

// LogsMaxMsgs bounds LOGS: a flood of errors drops the oldest, never fills the disk.
const LogsMaxMsgs = 5000

// LogsSubject is where a process publishes its warnings and errors; key is its
// ProcessKey (a part's user may publish to its own part's subjects only).
func LogsSubject(key string) string { return "locks.logs." + key }

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
		Subjects:    []string{"locks.logs.*", "locks.logs.*.*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxMsgs:     LogsMaxMsgs,
		MaxMsgSize:  16 << 10,
		Replicas:    c.Replicas,
	}
}
