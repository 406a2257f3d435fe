package config_test

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/lock-sensors/lock-sensors/internal/config"
)

// docs/configuration.md is the output of config.Markdown, so the table of settings cannot
// drift from the code: change a setting, regenerate, commit both.
func TestConfigurationDocIsCurrent(t *testing.T) {
	t.Parallel()
	var want bytes.Buffer
	if err := config.Markdown(&want); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("docs/configuration.md differs from the settings in internal/config: run\n" +
			"  go run ./cmd/locks config --markdown > docs/configuration.md\nand commit it")
	}
}

// Every setting is in the table, with its default and a meaning; the documented default is
// the one Load uses.
func TestSettingsAreDocumented(t *testing.T) {
	t.Parallel()
	var md bytes.Buffer
	if err := config.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, s := range config.Settings() {
		if s.Usage == "" {
			t.Errorf("%s has no meaning", s.Env)
		}
		if !strings.Contains(md.String(), "| `"+s.Env+"` |") {
			t.Errorf("%s is not in the table", s.Env)
		}
	}
	if n := len(config.Settings()); n < 50 {
		t.Errorf("%d settings: fewer than the configuration has", n)
	}
	if got := config.Default().RetrySchedule; !reflect.DeepEqual(got, config.DefaultRetrySchedule) {
		t.Errorf("the documented LOCKS_RETRY_SCHEDULE default gives %v, want DefaultRetrySchedule %v", got, config.DefaultRetrySchedule)
	}
}
