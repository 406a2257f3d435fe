package compose

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

var variable = regexp.MustCompile(`\$\{([A-Z_0-9]+)(?::([-?])([^}]*))?\}`)

// interpolate resolves ${VAR}, ${VAR:-default} and ${VAR:?message} as compose does.
func interpolate(v string, env map[string]string) string {
	return variable.ReplaceAllStringFunc(v, func(m string) string {
		p := variable.FindStringSubmatch(m)
		if val := env[p[1]]; val != "" || p[2] != "-" {
			return val
		}
		return p[3]
	})
}

// Each part's environment, resolved with a copy of example.env, is refused by locks at start
// while a CHANGE_ME is left in it; with every placeholder replaced it is a configuration
// locks accepts (so the defaults compose fills in are valid values).
func TestComposeExampleRefusedUntilChanged(t *testing.T) {
	f, _ := load(t)
	ex, err := os.ReadFile("example.env")
	if err != nil {
		t.Fatal(err)
	}
	example, changed := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(string(ex), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(k, "#") {
			example[k] = v
			changed[k] = regexp.MustCompile(`(?i)change_?me`).ReplaceAllString(v, "s3cret")
		}
	}
	for name, s := range f.Services {
		if len(s.Command) == 0 || (s.Command[0] != "run" && s.Command[0] != "migrate") {
			continue
		}
		resolve := func(env map[string]string) func(string) string {
			return func(k string) string { return interpolate(s.Environment[k], env) }
		}
		_, err := config.Load(resolve(example), nil, nil)
		var ce *config.Error
		if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "CHANGE_ME") {
			t.Errorf("%s with example.env as it is: %v, want a placeholder refused", name, err)
		}
		if _, err := config.Load(resolve(changed), nil, nil); err != nil {
			t.Errorf("%s with the placeholders replaced: %v", name, err)
		}
	}
}
