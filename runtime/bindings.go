package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/meshkit/mesh/internal/stateformat"
)

// bindingRecord remembers, in the node's state dir, which patterns each
// module queue was bound to, so that a pattern a module no longer consumes
// is unbound when it starts again. AMQP itself cannot list a queue's
// bindings (docs/adr/0004-binding-records.md).
type bindingRecord struct {
	dir string
}

func (r bindingRecord) path(queue string) string {
	return filepath.Join(r.dir, "bindings", queue+".json")
}

// load returns the patterns recorded for queue, or none.
func (r bindingRecord) load(queue string) ([]string, error) {
	patterns, _, err := r.recorded(queue)
	return patterns, err
}

// recorded returns the patterns recorded for queue, and whether there is a
// record of it at all.
func (r bindingRecord) recorded(queue string) ([]string, bool, error) {
	b, err := os.ReadFile(r.path(queue))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read binding record: %w", err)
	}
	var patterns []string
	if err := json.Unmarshal(b, &patterns); err != nil {
		// Format 1 (v0.1.0, and this release) is a JSON list; a later
		// format is an object that says its format.
		var later struct {
			Format int `json:"format"`
		}
		if json.Unmarshal(b, &later) == nil && later.Format > stateformat.Bindings.Version {
			return nil, false, fmt.Errorf("read binding record: %w", stateformat.Bindings.Check(r.path(queue), later.Format))
		}
		return nil, false, fmt.Errorf("read binding record %s: %w", r.path(queue), err)
	}
	return patterns, true, nil
}

// store records patterns for queue, atomically (write, sync, rename).
func (r bindingRecord) store(queue string, patterns []string) error {
	p := r.path(queue)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	sorted := slices.Clone(patterns)
	slices.Sort(sorted)
	b, err := json.Marshal(sorted)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".bindings-*")
	if err != nil {
		return fmt.Errorf("write binding record: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write binding record: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write binding record: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write binding record: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("write binding record: %w", err)
	}
	return nil
}
