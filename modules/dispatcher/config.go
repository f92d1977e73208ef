package dispatcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meshkit/mesh/modules/internal/settings"
)

// Defaults of the settings.
const (
	DefaultName    = "dispatcher"
	DefaultTimeout = 30 * time.Second
	// MaxConcurrentRuns bounds a trigger's max_concurrent_runs.
	MaxConcurrentRuns = 16
)

// Config is the dispatcher's settings.
type Config struct {
	// Name is the module's name (default "dispatcher"); it must match its
	// entry in meshd's config.
	Name string `json:"name,omitempty"`
	// Store is the path of the firing record (SQLite, created if
	// missing), in the node's state dir.
	Store    string    `json:"store"`
	Triggers []Trigger `json:"triggers"`
	// OnFire, for a program that embeds the dispatcher, is told of each
	// firing once it is recorded (before its message is acknowledged).
	// It must not block for long.
	OnFire func(Fire) `json:"-"`
}

// Trigger takes work from one source and hands each message to a tool.
type Trigger struct {
	// Name names the trigger in the firing record, logs and meshctl.
	Name string `json:"name"`
	// Queue is an existing broker queue to consume passively (never
	// declared or deleted), or Pattern an AMQP topic pattern of events on
	// the mesh. Exactly one is set.
	Queue   string `json:"queue,omitempty"`
	Pattern string `json:"pattern,omitempty"`
	// Tool is the tool each message is handed to.
	Tool string `json:"tool"`
	// Inputs are constant fields merged into each request.
	Inputs map[string]json.RawMessage `json:"inputs,omitempty"`
	// MaxConcurrentRuns bounds the tool calls at once (1 to 16, default
	// 1); for a queue it is also the prefetch.
	MaxConcurrentRuns int `json:"max_concurrent_runs,omitempty"`
	// SingleActiveConsumer asks for one global order across dispatchers
	// (on any node) taking the same queue: the dispatcher consumes it
	// exclusively (sdk.Mesh.Exclusive), the others stand by and one takes
	// over when it goes. It needs a queue source and max_concurrent_runs
	// 1.
	SingleActiveConsumer bool `json:"single_active_consumer,omitempty"`
	// Timeout bounds one call (default 30s; the module's handler timeout
	// bounds it too).
	Timeout Duration `json:"timeout,omitempty"`
	// Enabled is true unless set false: a disabled trigger consumes
	// nothing.
	Enabled *bool `json:"enabled,omitempty"`
}

// enabled says whether the trigger consumes.
func (t Trigger) enabled() bool { return t.Enabled == nil || *t.Enabled }

// Duration is a time.Duration read from JSON as text ("10s") or as
// nanoseconds.
type Duration = settings.Duration

// reserved are the request fields the dispatcher sets itself.
var reserved = []string{"message", "meta"}

// check validates c and fills in the defaults.
func (c *Config) check() error {
	if c.Name == "" {
		c.Name = DefaultName
	}
	var errs []error
	if c.Store == "" {
		errs = append(errs, errors.New("store: the path of the firing record is empty"))
	}
	if len(c.Triggers) == 0 {
		errs = append(errs, errors.New("triggers: none configured"))
	}
	names := map[string]bool{}
	for i := range c.Triggers {
		t := &c.Triggers[i]
		field := fmt.Sprintf("triggers[%d]", i)
		switch {
		case t.Name == "" || strings.ContainsAny(t.Name, " \t\n"):
			errs = append(errs, fmt.Errorf("%s.name: %q is empty or has whitespace", field, t.Name))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("%s.name: %q is configured twice", field, t.Name))
		}
		names[t.Name] = true
		if (t.Queue == "") == (t.Pattern == "") {
			errs = append(errs, fmt.Errorf("%s: set exactly one of queue (an existing broker queue) and pattern (events on the mesh)", field))
		}
		if t.Tool == "" {
			errs = append(errs, fmt.Errorf("%s.tool: is empty", field))
		}
		for _, k := range reserved {
			if _, ok := t.Inputs[k]; ok {
				errs = append(errs, fmt.Errorf("%s.inputs: %q is the dispatcher's own field of the request", field, k))
			}
		}
		if t.MaxConcurrentRuns == 0 {
			t.MaxConcurrentRuns = 1
		}
		if t.MaxConcurrentRuns < 1 || t.MaxConcurrentRuns > MaxConcurrentRuns {
			errs = append(errs, fmt.Errorf("%s.max_concurrent_runs: %d is not from 1 to %d", field, t.MaxConcurrentRuns, MaxConcurrentRuns))
		}
		if t.SingleActiveConsumer && t.Queue == "" {
			errs = append(errs, fmt.Errorf("%s.single_active_consumer: needs a queue source (a pattern's queue is each node's own)", field))
		}
		if t.SingleActiveConsumer && t.MaxConcurrentRuns != 1 {
			errs = append(errs, fmt.Errorf("%s.single_active_consumer: a global order needs max_concurrent_runs 1, not %d", field, t.MaxConcurrentRuns))
		}
		if t.Timeout < 0 {
			errs = append(errs, fmt.Errorf("%s.timeout: is negative", field))
		}
		if t.Timeout == 0 {
			t.Timeout = Duration(DefaultTimeout)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("dispatcher config: %w", errors.Join(errs...))
	}
	return nil
}
