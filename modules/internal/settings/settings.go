// Package settings holds the value types that the shipped modules (agent and
// dispatcher) share in the settings they read from their entry's config in
// meshd's config. Each module re-exports what it uses under its own name, so
// that its documentation shows it:
//
//	// Duration is a time.Duration read from JSON as text ("10s") or as
//	// nanoseconds.
//	type Duration = settings.Duration
package settings

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a time.Duration read from JSON as text ("10s", as YAML
// writes it) or as nanoseconds, and written as text.
type Duration time.Duration

// UnmarshalJSON reads "10s" or 10000000000.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s: want text like \"10s\" or nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes the duration as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
