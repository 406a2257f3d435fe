// Package part holds what every part's constructor shares: the one error for a missing
// dependency, so that `New(cfg, deps)` of any part fails the same way, and the registration
// of its metrics.
package part

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrMissingDep is wrapped by every constructor refusing a nil dependency.
var ErrMissingDep = errors.New("missing dependency")

// Dep is one named dependency of a part.
type Dep struct {
	Name  string
	Value any
}

// Require fails with ErrMissingDep naming every dependency of the part that is nil
// (including an interface holding a nil pointer).
func Require(partName string, deps ...Dep) error {
	var missing []string
	for _, d := range deps {
		if isNil(d.Value) {
			missing = append(missing, d.Name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w: %s", partName, ErrMissingDep, strings.Join(missing, ", "))
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return r.IsNil()
	}
	return false
}

// Register registers every collector of a part (or of a piece it runs) with reg, failing on
// the first that does not register, named by what.
func Register(reg prometheus.Registerer, what string, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("%s: register metrics: %w", what, err)
		}
	}
	return nil
}
