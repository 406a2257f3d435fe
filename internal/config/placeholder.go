package config

import (
	"slices"
	"strings"
)

// secretSettings are the variables that hold a password, a token or a signing secret.
var secretSettings = append(append([]string{"LOCKS_API_TOKENS"}, secretURLs...), alertSecrets...)

// placeholders are what the example files (deploy/compose/example.env,
// deploy/systemd/locks.env.example, the chart's values.yaml) put where a secret goes.
var placeholders = []string{"CHANGE_ME", "CHANGEME"}

// placeholder reports whether a secret setting still holds an example file's placeholder:
// a copy of the example that starts would run with a password everybody knows.
func placeholder(env, v string) bool {
	if !slices.Contains(secretSettings, env) {
		return false
	}
	up := strings.ToUpper(v)
	return slices.ContainsFunc(placeholders, func(p string) bool { return strings.Contains(up, p) })
}
