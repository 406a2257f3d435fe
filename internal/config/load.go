package config

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// FlagName is the kebab-case flag of a variable: LOCKS_AMQP_URL → amqp-url. The one
// exception is LOCKS_PARTITIONS, whose flag is --partition-count because `locks run
// --partitions` names the partitions one process owns.
func FlagName(env string) string {
	if env == "LOCKS_PARTITIONS" {
		return "partition-count"
	}
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "LOCKS_")), "_", "-")
}

// Register adds one string flag per variable to fs. Call Load after fs.Parse.
func Register(fs *flag.FlagSet) map[string]*string {
	vals := map[string]*string{}
	for _, s := range settings() {
		vals[s.env] = fs.String(FlagName(s.env), "", fmt.Sprintf("%s (env %s, default %q)", s.usage, s.env, s.def))
	}
	return vals
}

// Load builds the Config from defaults, then the environment (getenv), then flags that were
// set on fs. The first bad value is returned as *Error.
func Load(getenv func(string) string, fs *flag.FlagSet, flags map[string]*string) (Config, error) {
	set := map[string]bool{}
	if fs != nil {
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	}
	var c Config
	given := map[string]bool{}
	for _, s := range settings() {
		name, v := s.env, s.def
		if e, ok := lookup(getenv, s.env); ok {
			v, given[s.env] = e, true
		}
		if set[FlagName(s.env)] {
			v, name, given[s.env] = *flags[s.env], "--"+FlagName(s.env), true
		}
		if err := RefusePlaceholders(v); err != nil {
			return Config{}, &Error{Var: name, Value: shown(s.env, v), Reason: err.Error()}
		}
		if err := s.set(&c, v); err != nil {
			return Config{}, &Error{Var: name, Value: shown(s.env, v), Reason: hiddenIn(s.env, v, err.Error())}
		}
	}
	if err := c.retentionGiven(given); err != nil {
		return Config{}, err
	}
	// JetStream on one server refuses more than one replica; say so before anything starts.
	if c.NATSURL == "" && c.NATSReplicas > 1 {
		name := "LOCKS_NATS_REPLICAS"
		if set[FlagName(name)] {
			name = "--" + FlagName(name)
		}
		return Config{}, &Error{Var: name, Value: strconv.Itoa(c.NATSReplicas),
			Reason: "the embedded NATS server is one server; more replicas need LOCKS_NATS_URL pointing at a cluster"}
	}
	if err := checkAlerts(c.Alerts); err != nil {
		return Config{}, err
	}
	return c, nil
}

func lookup(getenv func(string) string, k string) (string, bool) {
	if getenv == nil {
		v, ok := os.LookupEnv(k)
		return v, ok
	}
	v := getenv(k)
	return v, v != ""
}
