package natsx

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// The NATS permission matrix: what each part's user may publish and subscribe to. One source
// for the embedded server's per-part users (EmbeddedPartAuth) and for
// deploy/nats/accounts.conf (AccountsConf, `locks nats-accounts`), so the two cannot drift.
//
// NATS permissions match whole subject tokens, never a prefix of one, and a consumer's name
// is one token of the JetStream API's subjects ($JS.API.CONSUMER.<verb>.<stream>.<consumer>,
// $JS.ACK.<stream>.<consumer>.…). So a part may, on the streams it reads:
//   - create, read the info of, fetch from, ack and delete consumers of any name, except
//   - every consumer another part owns (the durable names below, for every partition): those
//     it may not touch at all, but for the api and the alerter reading their info (lag);
//   - and nobody but the operator's user may pause, reset, unpin, step down or move a
//     consumer, list the consumers of a stream (their names would be the way to the unnamed
//     ones of other parts), or create one through the legacy subject that carries the name
//     only in the request's body.
//
// The consumers a part creates without a name get the server's random one, which no other
// part can learn. Each part receives replies and pushed messages only under its own inbox
// prefix (InboxPrefix), so subscribing to another part's deliveries is refused too.

// Parts are the parts that connect to NATS, each as its own user.
var Parts = []string{"bridge", "state", "history", "notifier", "watchdog", "api", "alerter"}

// InboxPrefix is part's inbox prefix: its replies and push deliveries arrive there, and its
// user may subscribe nowhere else (beside a few control subjects).
func InboxPrefix(part string) string { return "_INBOX_" + part }

// grant is what one part does with NATS.
type grant struct {
	publish   []string // core publishes: appends, KV puts, control messages
	subscribe []string // core subscriptions beside its inbox
	reads     []string // streams it reads (consumers of its own, direct and stored gets)
	observe   bool     // may read the info of the other parts' consumers (their lag)
}

// Durable consumer names, as the parts make them with their default settings.
func durables(part string, partitions int) map[string][]string {
	each := func(f func(p int) string) []string {
		out := make([]string, partitions)
		for p := range partitions {
			out[p] = f(p)
		}
		return out
	}
	switch part {
	case "state":
		return map[string][]string{ReadingsStream: each(func(p int) string { return "state-p" + strconv.Itoa(p) })}
	case "watchdog":
		return map[string][]string{ReadingsStream: each(func(p int) string { return "watchdog-" + strconv.Itoa(p) })}
	case "notifier":
		return map[string][]string{EventsStream: each(func(p int) string { return "notifier-" + strconv.Itoa(p) })}
	case "history":
		return map[string][]string{
			ReadingsStream:   each(func(p int) string { return "history_readings_" + strconv.Itoa(p) }),
			EventsStream:     each(func(p int) string { return "history_events_" + strconv.Itoa(p) }),
			DeliveriesStream: {"history_deliveries"},
		}
	}
	return nil
}

// ConsumerOwner is the part that owns the durable consumer name of stream in a system of
// partitions, per the matrix ("" when the matrix knows no such consumer: it is then
// protected from no other part). A test checks that every durable consumer a running system
// makes is known here, so that renaming one in a part cannot silently drop its protection.
func ConsumerOwner(stream, name string, partitions int) string {
	for _, part := range Parts {
		if slices.Contains(durables(part, partitions)[stream], name) {
			return part
		}
	}
	return ""
}

func kvStream(bucket string) string { return "KV_" + bucket }
func kvPut(bucket string) string    { return "$KV." + bucket + ".>" }

var grants = map[string]grant{
	// RabbitMQ -> READINGS; reads READINGS to compare a redelivered message with its
	// sensor's earlier readings, and its own bucket bridge_sessions.
	"bridge": {
		publish: []string{"readings.in.*", kvPut(BridgeSessionsBucket)},
		reads:   []string{ReadingsStream, kvStream(BridgeSessionsBucket)},
	},
	// READINGS -> Postgres state, outbox -> EVENTS: the only user that may publish events.
	"state": {
		publish: []string{"events.*.*", SetAsideSubject("state"), kvPut(LeasesBucket("state"))},
		reads:   []string{ReadingsStream, EventsStream, kvStream(LeasesBucket("state"))},
	},
	// READINGS, EVENTS, DELIVERIES -> ClickHouse. Publishes nothing but its set-aside records.
	"history": {
		publish: []string{SetAsideSubject("history")},
		reads:   []string{ReadingsStream, EventsStream, DeliveriesStream},
	},
	// EVENTS -> webhooks; every attempt -> DELIVERIES. Hears the API's breaker resets and
	// registry changes (core NATS).
	"notifier": {
		publish:   []string{"deliveries.*", SetAsideSubject("notifier"), kvPut(LeasesBucket("notifier"))},
		subscribe: []string{"locks.control.notifier.reset.*", "locks.control.notifier.changed.*"},
		reads:     []string{EventsStream, DeliveriesStream, kvStream(LeasesBucket("notifier"))},
	},
	// READINGS -> the liveness bucket; its expiries -> liveness_timeout readings in READINGS.
	"watchdog": {
		publish: []string{"readings.in.*", kvPut(LivenessBucket), SetAsideSubject("watchdog"), kvPut(LeasesBucket("watchdog"))},
		reads:   []string{ReadingsStream, kvStream(LivenessBucket), kvStream(LeasesBucket("watchdog"))},
	},
	// Admin API: reads the log for projection lag, rebuilds, the feeds, the set-aside list,
	// the process registry and LOGS (dashboard); writes none of the streams. Tells the
	// notifiers to reset a client's breaker or re-read a client.
	"api": {
		publish: []string{"locks.control.notifier.reset.*", "locks.control.notifier.changed.*"},
		reads: []string{ReadingsStream, EventsStream, DeliveriesStream, SetAsideStream, LogsStream,
			kvStream(ProcessesBucket)},
		observe: true,
	},
	// Alerter: reads READINGS (projection lag, checkpoint identity), SET_ASIDE and the
	// process registry; writes nothing to NATS.
	"alerter": {
		reads:   []string{ReadingsStream, SetAsideStream, kvStream(ProcessesBucket)},
		observe: true,
	},
}

// everyPart is what every part's process does: keep its registry key and tee its warnings
// to LOGS (internal/procs), both under its part's own prefix (ProcessKey), and look up
// JetStream and the streams.
func everyPart(part string) []string {
	return []string{"$KV." + ProcessesBucket + "." + part + ".*", LogsSubject(part + ".*"),
		"$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES"}
}

// readStream is what reading stream s with consumers of one's own takes.
func readStream(s string) []string {
	return []string{
		"$JS.API.CONSUMER.CREATE." + s + ".*", "$JS.API.CONSUMER.CREATE." + s + ".*.>",
		"$JS.API.CONSUMER.INFO." + s + ".*", "$JS.API.CONSUMER.DELETE." + s + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + s + ".*",
		"$JS.ACK." + s + ".>", "$JS.FC." + s + ".>",
		"$JS.API.DIRECT.GET." + s, "$JS.API.DIRECT.GET." + s + ".>", "$JS.API.STREAM.MSG.GET." + s,
	}
}

// othersConsumer is what readStream allows on consumer c of stream s, less its info for a
// part that observes (the projections' lag is read from their consumers).
func othersConsumer(s, c string, observe bool) []string {
	out := []string{
		"$JS.API.CONSUMER.CREATE." + s + "." + c, "$JS.API.CONSUMER.CREATE." + s + "." + c + ".>",
		"$JS.API.CONSUMER.DELETE." + s + "." + c, "$JS.API.CONSUMER.MSG.NEXT." + s + "." + c,
		"$JS.ACK." + s + "." + c + ".>", "$JS.FC." + s + "." + c + ".>",
	}
	if !observe {
		out = append(out, "$JS.API.CONSUMER.INFO."+s+"."+c)
	}
	return out
}

// Permissions are the allow and deny lists of part's user for a system of partitions.
type Permissions struct {
	PublishAllow, PublishDeny, SubscribeAllow []string
}

// PartPermissions is part's row of the matrix.
func PartPermissions(part string, partitions int) (Permissions, error) {
	g, ok := grants[part]
	if !ok {
		return Permissions{}, fmt.Errorf("no NATS permissions for part %q", part)
	}
	var p Permissions
	p.PublishAllow = append(everyPart(part), g.publish...)
	for _, s := range g.reads {
		p.PublishAllow = append(p.PublishAllow, readStream(s)...)
	}
	// The legacy durable create names the consumer in its subject: allowed for one's own.
	own := durables(part, partitions)
	for _, s := range slices.Sorted(maps.Keys(own)) {
		for _, c := range own[s] {
			p.PublishAllow = append(p.PublishAllow, "$JS.API.CONSUMER.DURABLE.CREATE."+s+"."+c)
		}
	}
	for _, other := range Parts {
		if other == part {
			continue
		}
		for s, names := range durables(other, partitions) {
			if !slices.Contains(g.reads, s) {
				continue // not allowed anything on s in the first place
			}
			for _, c := range names {
				p.PublishDeny = append(p.PublishDeny, othersConsumer(s, c, g.observe)...)
			}
		}
	}
	p.SubscribeAllow = append([]string{InboxPrefix(part) + ".>"}, g.subscribe...)
	slices.Sort(p.PublishDeny)
	return p, nil
}

// server is the nats-server form of p.
func (p Permissions) server() *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.PublishAllow, Deny: p.PublishDeny},
		Subscribe: &server.SubjectPermission{Allow: p.SubscribeAllow},
	}
}

// AccountsConf is deploy/nats/accounts.conf for a system of partitions: the account LOCKS,
// its operator's user admin, and one user per part with its row of the matrix, each
// reading its password from the server's environment (LOCKS_NATS_<PART>_PASSWORD).
func AccountsConf(partitions int) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, `# lock-sensors: NATS users per part, each allowed only what that part does.
#
# GENERATED for %d partitions by `+"`locks nats-accounts --partitions=%d`"+` (internal/natsx/permissions.go,
# which also gives the embedded server's per-part users the same rows); generate it again for
# another partition count, never edit it by hand. docs/security.md explains the matrix.
#
# Include it at the top level of a server's config (`+"`include ./accounts.conf`"+`). It defines the
# account LOCKS (JetStream enabled) and its users; nothing else can connect to it. Passwords
# come from the server's environment (plain text or a bcrypt hash from `+"`nats server passwd`"+`);
# a part connects with LOCKS_NATS_URL=nats://<user>:<password>@host:4222 and
# LOCKS_NATS_DECLARE=false, since only admin may create or update streams: run `+"`locks migrate`"+`
# as admin first. A part's process takes its replies under _INBOX_<part> (one part per process).

accounts {
  LOCKS {
    jetstream: enabled
    users: [
      # The operator's user: `+"`locks replay`, `locks migrate`"+`, the nats CLI.
      {user: admin, password: $LOCKS_NATS_ADMIN_PASSWORD}
`, partitions, partitions)
	list := func(indent string, xs []string) string {
		var l strings.Builder
		for i, x := range xs {
			l.WriteString(indent + strconv.Quote(x))
			if i < len(xs)-1 {
				l.WriteString(",")
			}
			l.WriteString("\n")
		}
		return l.String()
	}
	for _, part := range Parts {
		p, err := PartPermissions(part, partitions)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n      {user: %s, password: $LOCKS_NATS_%s_PASSWORD, permissions: {\n", part, strings.ToUpper(part))
		fmt.Fprintf(&b, "        publish: {\n          allow: [\n%s          ]\n", list("            ", p.PublishAllow))
		if len(p.PublishDeny) > 0 {
			fmt.Fprintf(&b, "          deny: [\n%s          ]\n", list("            ", p.PublishDeny))
		}
		fmt.Fprintf(&b, "        }\n        subscribe: {allow: [%s]}\n      }}\n", strings.TrimSpace(strings.ReplaceAll(list("", p.SubscribeAllow), "\n", " ")))
	}
	b.WriteString("    ]\n  }\n}\n")
	return b.String(), nil
}
