package runtime

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/meshkit/mesh/internal/wire"
)

// Queue types a module queue can have.
const (
	// QueueQuorum is the default (docs/adr/0002-default-queue-type.md): the
	// broker counts deliveries and enforces the attempt limit even when a
	// consumer crashes.
	QueueQuorum = "quorum"
	// QueueClassic counts nothing on the broker; the runtime counts
	// attempts itself (docs/adr/0003-classic-queue-attempts.md). Only a
	// classic queue can honour priorities.
	QueueClassic = "classic"
)

// Defaults of Config.
const (
	DefaultAMQPURL        = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPrefetch       = 32
	DefaultMaxAttempts    = 5
	DefaultMaxBodyBytes   = 1 << 20
	DefaultHandlerTimeout = 30 * time.Second
	DefaultRetryMin       = 200 * time.Millisecond
	DefaultRetryMax       = 30 * time.Second
	DefaultCallTimeout    = 30 * time.Second
)

// Config configures a Node. The zero value of every field but Node takes
// its default; Validate names the field and the rule that broke.
type Config struct {
	// Node is this node's name, unique on the mesh, one word.
	Node string
	// AMQPURL is the broker, amqp://user:pass@host:port/vhost. It is never
	// logged with its password.
	AMQPURL string
	// StateDir holds node-local state (the module binding records).
	// Default: $XDG_STATE_HOME/mesh/<node>, or ~/.local/state/mesh/<node>.
	StateDir string
	// Module holds the defaults for every module; each field can be
	// overridden per module when it is loaded.
	Module ModuleConfig
	// MaxBodyBytes refuses bigger bodies at emit. Default 1 MiB.
	MaxBodyBytes int
	// RetryMin and RetryMax bound the exponential back-off before a failed
	// event is tried again. Defaults 200ms and 30s.
	RetryMin, RetryMax time.Duration
	// CallTimeout is a tool call's deadline when its context has none.
	// Default 30s.
	CallTimeout time.Duration
	// Logger receives the node's structured log. Default slog.Default().
	Logger *slog.Logger
}

// ModuleConfig is how one module consumes. Zero fields take the node's
// defaults.
type ModuleConfig struct {
	// QueueType is QueueQuorum (default) or QueueClassic.
	QueueType string
	// Prefetch bounds unacknowledged deliveries, of events and, separately,
	// of tool requests; a module serving tools handles up to Prefetch
	// requests of each tool at once. Default 32.
	Prefetch int
	// Concurrency is how many event handler calls run at once, at most
	// Prefetch. Default 1: events are handled in queue order, retries
	// aside.
	Concurrency int
	// MaxAttempts is how many times a handler is tried before the event is
	// dead-lettered. Default 5. It is also the queue's delivery limit, so
	// changing it for an existing quorum queue is refused by the broker.
	MaxAttempts int
	// HandlerTimeout bounds one handler call; past it the call counts as a
	// failed attempt. Default 30s.
	HandlerTimeout time.Duration
	// MaxPriority declares the queue with x-max-priority so it honours
	// event priorities (1 to 9). Classic queues only; 0 means none.
	MaxPriority int
	// EmitGrants are topic patterns of full event types outside its own
	// namespace the module may emit with sdk.AsFullType ("mesh.delivery.#",
	// "node.*.drained"). None by default.
	EmitGrants []string
	// ToolGrants, when not nil, are the topic patterns of the tool keys the
	// module may serve; a Serve outside them is refused. nil places no
	// limit (a module compiled into the program is trusted); meshd's config
	// always sets it for module processes.
	ToolGrants []string
}

func (c *Config) withDefaults() {
	if c.AMQPURL == "" {
		c.AMQPURL = DefaultAMQPURL
	}
	if c.StateDir == "" && c.Node != "" {
		base := os.Getenv("XDG_STATE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				home = os.TempDir()
			}
			base = filepath.Join(home, ".local", "state")
		}
		c.StateDir = filepath.Join(base, "mesh", c.Node)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.RetryMin == 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Module = c.Module.over(ModuleConfig{
		QueueType:      QueueQuorum,
		Prefetch:       DefaultPrefetch,
		Concurrency:    1,
		MaxAttempts:    DefaultMaxAttempts,
		HandlerTimeout: DefaultHandlerTimeout,
	})
}

// over fills m's zero fields from d.
func (m ModuleConfig) over(d ModuleConfig) ModuleConfig {
	if m.QueueType == "" {
		m.QueueType = d.QueueType
	}
	if m.Prefetch == 0 {
		m.Prefetch = d.Prefetch
	}
	if m.Concurrency == 0 {
		m.Concurrency = d.Concurrency
	}
	if m.MaxAttempts == 0 {
		m.MaxAttempts = d.MaxAttempts
	}
	if m.HandlerTimeout == 0 {
		m.HandlerTimeout = d.HandlerTimeout
	}
	if m.MaxPriority == 0 {
		m.MaxPriority = d.MaxPriority
	}
	if m.EmitGrants == nil {
		m.EmitGrants = d.EmitGrants
	}
	if m.ToolGrants == nil {
		m.ToolGrants = d.ToolGrants
	}
	return m
}

// Validate checks the configuration after defaults, naming the field and
// the rule of every error it finds.
func (c Config) Validate() error {
	c.withDefaults()
	var errs []error
	if err := wire.ValidateWord("node name", c.Node); err != nil {
		errs = append(errs, fmt.Errorf("node: %w", err))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max_body_bytes: %d is negative", c.MaxBodyBytes))
	}
	if c.RetryMin < 0 || c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry_min/retry_max: want 0 <= min <= max, have %v and %v", c.RetryMin, c.RetryMax))
	}
	if c.CallTimeout < 0 {
		errs = append(errs, fmt.Errorf("call_timeout: %v is negative", c.CallTimeout))
	}
	if err := c.Module.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (m ModuleConfig) validate() error {
	var errs []error
	switch m.QueueType {
	case QueueQuorum, QueueClassic:
	default:
		errs = append(errs, fmt.Errorf("queue_type: %q is not %q or %q", m.QueueType, QueueQuorum, QueueClassic))
	}
	if m.Prefetch < 1 || m.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("prefetch: %d is not within 1..65535", m.Prefetch))
	}
	if m.Concurrency < 1 || m.Concurrency > m.Prefetch {
		errs = append(errs, fmt.Errorf("concurrency: %d is not within 1..prefetch (%d)", m.Concurrency, m.Prefetch))
	}
	if m.MaxAttempts < 1 || m.MaxAttempts > 1000 {
		errs = append(errs, fmt.Errorf("max_attempts: %d is not within 1..1000", m.MaxAttempts))
	}
	if m.HandlerTimeout <= 0 {
		errs = append(errs, fmt.Errorf("handler_timeout: %v is not positive", m.HandlerTimeout))
	}
	if m.MaxPriority < 0 || m.MaxPriority > 9 {
		errs = append(errs, fmt.Errorf("max_priority: %d is not within 0..9", m.MaxPriority))
	}
	for i, g := range m.EmitGrants {
		if err := wire.ValidatePattern(g); err != nil {
			errs = append(errs, fmt.Errorf("emit_grants[%d]: %w", i, err))
		}
	}
	for i, g := range m.ToolGrants {
		if err := wire.ValidatePattern(g); err != nil {
			errs = append(errs, fmt.Errorf("tool_grants[%d]: %w", i, err))
		}
	}
	if m.MaxPriority > 0 && m.QueueType != QueueClassic {
		errs = append(errs, fmt.Errorf("max_priority: only a classic queue honours priorities; set queue_type to %q or max_priority to 0", QueueClassic))
	}
	return errors.Join(errs...)
}

// redactURL returns u without its password, for logs.
func redactURL(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	return "(unparsable broker URL)"
}
