package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshkit/mesh/internal/delay"
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
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultPrefetch    = 32
	DefaultMaxAttempts = 5
	// DefaultMaxDelay is the longest delay a module may ask of an emit
	// unless its entry says otherwise (ModuleConfig.MaxDelay).
	DefaultMaxDelay = 90 * 24 * time.Hour
	// DefaultMaxScheduled and DefaultMaxScheduledBytes bound a module's
	// schedules waiting at once on its node unless its entry says
	// otherwise (ModuleConfig.MaxScheduled, MaxScheduledBytes).
	DefaultMaxScheduled      = 10_000
	DefaultMaxScheduledBytes = 64 << 20
	DefaultMaxBodyBytes      = 1 << 20
	DefaultHandlerTimeout    = 30 * time.Second
	DefaultRetryMin          = 200 * time.Millisecond
	DefaultRetryMax          = 30 * time.Second
	DefaultCallTimeout       = 30 * time.Second
	// DefaultConsumerTimeout is RabbitMQ's default consumer_timeout: a
	// delivery left unacknowledged longer closes its channel.
	DefaultConsumerTimeout = 30 * time.Minute
	DefaultSpoolMaxBytes   = 256 << 20
	DefaultEmitTimeout     = 30 * time.Second
	// DefaultRetryScheduleFrom is Config.RetryScheduleFrom's default: a
	// retry back-off of 10 s or more waits in the delay cascade (a
	// publish and a hop a set bit of it), a shorter one as a timer.
	DefaultRetryScheduleFrom = 10 * time.Second
	// DefaultHeartbeatInterval is meshd's Config.HeartbeatInterval.
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultReconnectMin      = 100 * time.Millisecond
	DefaultReconnectMax      = 10 * time.Second
	DefaultLockWait          = 30 * time.Second
	DefaultDedupRetention    = 24 * time.Hour
	// DefaultConsumerCheckInterval is how often a module checks that the
	// broker still has its consumers, and still feeds them.
	DefaultConsumerCheckInterval = 10 * time.Second
	DefaultDedupMaxEntries       = 1_000_000
)

// Config configures a Node. The zero value of every field but Node takes
// its default; Validate names the field and the rule that broke.
type Config struct {
	// Node is this node's name, unique on the mesh, one word.
	Node string
	// AMQPURL is the broker, amqp://user:pass@host:port/vhost. It is never
	// logged with its password.
	AMQPURL string
	// AMQPURLs are more addresses of the broker: the nodes of a RabbitMQ
	// cluster, with AMQPURL or without it (Brokers). The node is connected
	// to one at a time; each node starts at a place of its own in the list
	// (shuffled), and when a connection is lost or an address does not
	// answer, it tries the next. Every address must name the same user:
	// events carry it as their user-id, which the broker checks.
	AMQPURLs []string
	// StateDir holds node-local state: the spool (spool.db), the record
	// of handled events per module (dedup/) and the module binding records
	// (bindings/). One node process at a time may use it.
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

	// TLS configures amqps:// connections: the CA that signed the broker's
	// certificate and, for client-certificate authentication, a
	// certificate and key. Files are PEM. Empty fields use the system's
	// roots and no client certificate.
	TLS TLSConfig
	// ReconnectMin and ReconnectMax bound the exponential back-off, with
	// jitter, between attempts to reconnect to the broker. Defaults 100ms
	// and 10s.
	ReconnectMin, ReconnectMax time.Duration
	// LockWait is how long a reconnecting node, or one started on a
	// state dir whose last run did not close (killed), waits for its node
	// lock queue to be released by the broker (which notices a dead
	// connection only once it sees it closed or misses its heartbeats)
	// before it concludes another node of the same name runs. Default 30s.
	LockWait time.Duration
	// SpoolMaxBytes bounds the local spool of events the broker has not
	// confirmed (kept in StateDir while the broker is unreachable). When
	// it is full, emits fail with wire.ErrBackPressure. Default 256 MiB.
	SpoolMaxBytes int64
	// EmitTimeout is how long an emit whose context has no deadline keeps
	// retrying while the broker refuses it (a queue at its length limit)
	// before it fails with wire.ErrRefused. Default 30s.
	EmitTimeout time.Duration
	// ConsumerTimeout must be the broker's consumer_timeout (RabbitMQ's
	// default is 30 min). A module whose handler timeout plus retry
	// back-off could hold a delivery longer is refused, because the broker
	// would close its channel. Default 30 min.
	ConsumerTimeout time.Duration
	// ConsumerCheckInterval is how often each module asks the broker
	// whether its consumers are still there and fed (checkConsumers); 0 means
	// DefaultConsumerCheckInterval, a negative value turns the check off.
	ConsumerCheckInterval time.Duration
	// DedupRetention is how long a module remembers the ids of events it
	// handled, to acknowledge redeliveries without handling them again.
	// Default 24h.
	DedupRetention time.Duration
	// DedupMaxEntries bounds the ids each module remembers; the oldest
	// are forgotten first. Default 1,000,000 (about 80 MB of memory
	// per module when full).
	DedupMaxEntries int
	// Ephemeral makes a short-lived client node (meshctl): it takes no
	// node lock, keeps no spool and does not reconnect; an emit it cannot
	// get confirmed fails.
	Ephemeral bool
	// StartWithoutBroker lets New return a node whose broker does not
	// answer yet (connection refused, a timeout): the node starts
	// disconnected, as if it had lost its connection, spools emits, takes
	// modules (they attach when it connects) and connects with the
	// reconnect back-off. Errors the broker gives once it answers (wrong
	// credentials, no such virtual host, the node name taken) still fail
	// New. meshd sets it, so it needs no ordering after the broker. An
	// ephemeral node ignores it.
	StartWithoutBroker bool
	// HeartbeatInterval, when above 0, makes the node take part in
	// membership: it sends node.<node>.heartbeat (with its modules) that
	// often, and checks that the others still send theirs; one silent for
	// 3 of its own intervals is reported once as node.<peer>.unreachable.
	// Off by default (meshd turns it on: DefaultHeartbeatInterval).
	// Ephemeral nodes take no part. It is also how often a node with a
	// MeterProvider reads its modules' queues from the broker, for the
	// metrics mesh.queue.depth and mesh.queue.consumers
	// (DefaultHeartbeatInterval when it is 0 or less).
	HeartbeatInterval time.Duration
	// RetryScheduleFrom is the shortest retry back-off (ModuleConfig.Retry)
	// that goes through the delay cascade instead of being held; default
	// DefaultRetryScheduleFrom. Shorter ones are held, as the node's own
	// back-off always is, and count against ConsumerTimeout.
	RetryScheduleFrom time.Duration
	// Delays declares the delay cascade on the broker (ADR 32: 28 levels
	// of quorum queues, internal/delay) on every connect and runs the
	// node's mover, which publishes what comes due. A delayed emit
	// (sdk.After, sdk.At) needs it on the emitting node; any node of the
	// mesh with it on delivers what comes due, and with none on, what
	// comes due waits in mesh.delay.due. Off by default (meshd turns it
	// on unless its config says delays: false): declaring the cascade
	// takes about half a second. Ephemeral nodes (meshctl) may schedule
	// but run no mover.
	Delays bool
	// QueuePolicies carries the attempt limit of the queues the node
	// declares (x-delivery-limit) in a policy per queue, set through the
	// management API, so that a changed max_attempts takes effect on the
	// queue with its messages in place (ADR 43). It applies only when the
	// node's broker user may set policies (the policymaker or
	// administrator tag); otherwise, or when off, the limit is a queue
	// argument as in v0.1.0. Off by default (meshd turns it on unless its
	// config says queue_policies: false).
	QueuePolicies bool
	// QueueLimitPolicyOnly declares a new queue's attempt limit in its
	// policy alone, without the argument x-delivery-limit, so that a
	// higher max_attempts applies in place too (a policy can only lower
	// an argument's limit). Off (the zero value), a node that keeps
	// policies declares a new queue with the argument as well, as the
	// previous release (v0.1.0) declares it, so that a rollback to that
	// release declares the same queue rather than being refused (406
	// inequivalent arg, which stops v0.1.0's meshd); its policy still
	// lowers the limit in place. Only with QueuePolicies.
	QueueLimitPolicyOnly bool
	// ManagementURL is the broker's management API (http(s)://HOST:PORT),
	// for QueuePolicies; default the AMQP host's port 15672 (15671 for
	// amqps://), with the broker URL's user.
	ManagementURL string
	// DelayPublishers are broker users besides the node's own whose
	// schedules the node's mover delivers: the operator's, for meshctl
	// emit --after --node with a user of its own. A mover publishes as its
	// node's user, so each one added may have the node publish, when due,
	// any event type (ADR 32).
	DelayPublishers []string
	// DelayNode is the node whose mover delivers what this node schedules
	// (the last word of the delay's routing key); default the node itself.
	// meshctl, an ephemeral node with no mover, sets it.
	DelayNode string
	// History is the stream that keeps the mesh's history, replicated on
	// the broker, for modules that read it (sdk.Module.History: the audit
	// logger); every node but an ephemeral one declares it and binds it
	// to # on mesh.events on connect. Zero: none (ADR 35).
	History HistoryConfig
	// Identity ties each node's name (the x-node of its events and
	// requests) to the broker user it publishes as (their user-id, which
	// the broker verifies): with it on, the node refuses (enforce) or
	// reports (warn) an event or a tool request of its modules whose
	// x-node another user published (identity.go). Off by default.
	Identity IdentityConfig
	// MeterProvider receives the node's metrics (OpenTelemetry): counters
	// of what it published, spooled, handled, retried, dead-lettered and
	// suppressed (per module where it applies), gauges of its connection,
	// blocking and spool, and histograms of handler and call latency.
	// Nil: none are kept.
	MeterProvider metric.MeterProvider
	// TracerProvider receives the node's spans (OpenTelemetry): a producer
	// span per emit, a consumer span per handler run, a client span per
	// call and a server span per answer, joined across nodes and module
	// processes by the W3C traceparent header. Nil: none are recorded,
	// but an incoming trace context is still passed on.
	TracerProvider trace.TracerProvider
}

// TLSConfig names the PEM files of an amqps:// connection.
type TLSConfig struct {
	// CAFile is the CA certificate(s) that signed the broker's
	// certificate. Empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the node's client certificate and key,
	// both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name checked in the broker's certificate.
	// Empty: the host of the broker URL.
	ServerName string
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
	// failed attempt. Default 30s. Plus the node's RetryMax it must stay
	// below the node's ConsumerTimeout.
	HandlerTimeout time.Duration
	// Retry, if not empty, is the module's back-off before each retry of
	// a failed event, in order (the last repeats while attempts remain),
	// instead of the node's exponential RetryMin..RetryMax; MaxAttempts
	// then defaults to len(Retry)+1. A back-off of Config.RetryScheduleFrom
	// or more, on a node with delays on, does not hold the delivery: the
	// failed one is acknowledged once a copy carrying its attempts
	// (x-mesh-attempt) is scheduled back to the module's queue through the
	// delay cascade, so a retry may wait hours or days, past the broker's
	// consumer_timeout (ADR 32). Each back-off is between 0 and the longest
	// delay.
	Retry []time.Duration
	// AllowDuplicates turns off de-duplication for the whole module: every
	// delivery reaches its handler, even one whose id it already handled.
	// Use it for handlers that are idempotent by themselves.
	AllowDuplicates bool
	// AllowUndeclaredEmits lets the module emit event names its
	// sdk.Module.Emits does not list. By default such an emit is refused
	// with sdk.ErrForbidden: Emits is what the mesh's graph shows.
	AllowUndeclaredEmits bool
	// SkipBodyValidation keeps the x-schema of the module's declared
	// schemas (sdk.Module.Schemas) but does not validate its emitted
	// bodies against them: for a module whose emits are too many, or
	// too large, to pay the validation (make bench measures it).
	SkipBodyValidation bool
	// MaxPriority declares the queue with x-max-priority so it honours
	// event priorities (1 to 9). Classic queues only; 0 means none.
	MaxPriority int
	// MaxDelay is the longest delay (sdk.After, sdk.At) the module may
	// ask of an emit, up to the cascade's longest; default
	// DefaultMaxDelay. A schedule waits on the broker until it is due,
	// cancelled or not (the levels cannot be browsed), so this bounds how
	// long what a module schedules holds space there.
	MaxDelay time.Duration
	// MaxScheduled and MaxScheduledBytes bound the module's schedules
	// waiting at once on the node (how many, and their bodies' bytes);
	// an emit past them is refused with sdk.ErrForbidden. Defaults
	// DefaultMaxScheduled and DefaultMaxScheduledBytes.
	MaxScheduled      int
	MaxScheduledBytes int64
	// EmitGrants are topic patterns of full event types outside its own
	// namespace the module may emit with sdk.AsFullType ("mesh.delivery.#",
	// "node.*.drained"). None by default.
	EmitGrants []string
	// ToolGrants, when not nil, are the topic patterns of the tool keys the
	// module may serve; a Serve outside them is refused. nil places no
	// limit (a module compiled into the program is trusted); meshd's config
	// always sets it for module processes.
	ToolGrants []string
	// CallGrants, when not nil, are the topic patterns of the tool keys the
	// module may call; a Call outside them is refused with
	// sdk.ErrForbidden by the host, before anything is sent. nil places
	// no limit; meshd's config always sets it (calls:).
	CallGrants []string
	// ConsumeGrants, when not nil, are the topic patterns of the names of
	// existing broker queues the module may consume (sdk.Mesh.Consume,
	// matched word by word on the queue name's dots). nil places no limit;
	// meshd's config always sets it (consumes:).
	ConsumeGrants []string
	// DeadLetterGrants, when not nil, are the topic patterns of the event
	// types whose dead letters the module receives (a DeadLetters
	// handler): its dead-letter queue is bound to mesh.events.dead with
	// exactly these patterns, so the broker delivers it no other. An
	// empty list refuses a DeadLetters handler. nil places no limit (the
	// pattern #); meshd's config always sets it (dead_letters:).
	DeadLetterGrants []string
	// DenyHistory refuses the module a History handler (sdk.Module.History):
	// meshd sets it for every module whose entry does not say history:
	// true. A module compiled into the program may read the history.
	DenyHistory bool
	// Callers says who may call the tools the module serves: for a tool
	// key pattern, the caller patterns allowed (CallerAllowed). A tool
	// that no entry matches takes the module's own default
	// (sdk.Module.Callers), else anyone may call it. The serving host
	// checks each request against the caller its node stamped and the
	// user-id the broker verified; a refused request gets the permanent
	// error code "forbidden" without running.
	Callers map[string][]string
	// Group, when not empty, makes the module's copies on every node that
	// names the same group one group (ADR 48): they share the queue
	// group.<group>.<module>.events, bound to the module's patterns, and
	// compete for its events, instead of each node's copy handling every
	// event from <node>.<module>.events. The node's own queue stays, bound
	// to nothing: what this node retries (a classic queue's copy, a retry
	// through the delay cascade, a suspect) waits there, for this node
	// alone, as the node's own copies always have (owned.go). Empty (the
	// default): the node's own queue, as ever. Never taken from the
	// node's defaults.
	Group string
	// Partitions, when above 0, makes the group keep order by key
	// (ADR 48): its events go to Partitions queues
	// group.<group>.<module>.pNNN by their key's slot (wire.Slot), each
	// consumed by one member at a time (single active consumer), which
	// handles the events of one key one at a time, in queue order, and
	// those of other keys in parallel up to Concurrency; a failed event
	// holds its key's later ones until it succeeds or is dead-lettered.
	// 1 is a single consumer of the whole group. Needs Group; at most
	// wire.Slots. 0 (the default): no order.
	Partitions int
	// OrderKey, with Partitions, is the group's rule for an event's key,
	// over any key its emitter gave: "source" (its x-source) or
	// "body.FIELD" (a field of its JSON body, a string or a number; names
	// joined by dots reach into objects). Every event then reaches the
	// group through its intake, which keys it by the rule; one that has
	// no key there is dead-lettered as malformed, naming the rule. Every
	// member must give the same rule. Empty (the default): the emitter's
	// key (sdk.WithKey, x-partition-key; none is the empty key).
	OrderKey string
	// Name, when set, is the name the module must report: a module
	// process that says another is refused before it may emit or call
	// anything (meshd sets it from the config entry's name).
	Name string
	// Settings are a module process's own settings (its config: in
	// meshd's config), as JSON: LoadPlugin hands them to the process,
	// where sdk/process.Settings reads them. An in-process module gets
	// its settings from the program that builds it.
	Settings json.RawMessage
	// RunAs, when not nil, is the user a module process runs as (meshd
	// must be root or hold CAP_SETUID and CAP_SETGID). nil: meshd's own.
	RunAs *Credential
	// Dir, when set, is the module's own directory, for what it stores
	// (the audit logger's database, the dispatcher's store): the process
	// finds it in MESH_MODULE_DIR (sdk/process.Dir) and as its HOME. The
	// host does not create it.
	Dir string
	// Launcher, when not empty, is the command a module process is
	// started through: the binary's path and args follow it, and it must
	// execute them in its place (meshd's confined launcher,
	// internal/confine, is one). It starts as meshd's user and, with
	// RunAs, must take RunAs on itself.
	Launcher []string
	// TempDir, when not empty, is the process's TMPDIR (where go-plugin's
	// socket of the process is made). The host does not create it.
	TempDir string

	// outcomesDue, set by LoadPlugin, counts the module process's
	// outcomes handed to their waiting handlers and not yet taken: the
	// workers they wake are about to hold their acks (nextDelivery).
	outcomesDue *atomic.Int64
	// isolation, set by LoadPlugin, is the module process's gate: a
	// suspect (an event in flight when the process exited) is handled
	// alone (isolation.go).
	isolation *isolation
}

// Credential is a user a module process runs as.
type Credential struct {
	UID, GID uint32
	// Name is the user's name when it has one (for the log and USER).
	Name string
}

func (c *Config) withDefaults() {
	if c.AMQPURL == "" && len(c.AMQPURLs) == 0 {
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
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = DefaultReconnectMax
	}
	if c.LockWait == 0 {
		c.LockWait = DefaultLockWait
	}
	if c.SpoolMaxBytes == 0 {
		c.SpoolMaxBytes = DefaultSpoolMaxBytes
	}
	if c.EmitTimeout == 0 {
		c.EmitTimeout = DefaultEmitTimeout
	}
	if c.ConsumerTimeout == 0 {
		c.ConsumerTimeout = DefaultConsumerTimeout
	}
	if c.RetryScheduleFrom == 0 {
		c.RetryScheduleFrom = DefaultRetryScheduleFrom
	}
	if c.ConsumerCheckInterval == 0 {
		c.ConsumerCheckInterval = DefaultConsumerCheckInterval
	}
	if c.DedupRetention == 0 {
		c.DedupRetention = DefaultDedupRetention
	}
	if c.DedupMaxEntries == 0 {
		c.DedupMaxEntries = DefaultDedupMaxEntries
	}
	if c.Identity.Mode == "" {
		c.Identity.Mode = IdentityOff
	}
	c.Module = c.Module.over(ModuleConfig{
		QueueType:      QueueQuorum,
		Prefetch:       DefaultPrefetch,
		Concurrency:    1,
		MaxAttempts:    DefaultMaxAttempts,
		HandlerTimeout: DefaultHandlerTimeout,
		MaxDelay:       DefaultMaxDelay,
		MaxScheduled:   DefaultMaxScheduled,

		MaxScheduledBytes: DefaultMaxScheduledBytes,
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
	if m.Retry == nil {
		m.Retry = d.Retry
	}
	if m.MaxAttempts == 0 && len(m.Retry) > 0 {
		m.MaxAttempts = len(m.Retry) + 1
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
	if m.MaxDelay == 0 {
		m.MaxDelay = d.MaxDelay
	}
	if m.MaxScheduled == 0 {
		m.MaxScheduled = d.MaxScheduled
	}
	if m.MaxScheduledBytes == 0 {
		m.MaxScheduledBytes = d.MaxScheduledBytes
	}
	if m.EmitGrants == nil {
		m.EmitGrants = d.EmitGrants
	}
	if m.ToolGrants == nil {
		m.ToolGrants = d.ToolGrants
	}
	if m.CallGrants == nil {
		m.CallGrants = d.CallGrants
	}
	if m.ConsumeGrants == nil {
		m.ConsumeGrants = d.ConsumeGrants
	}
	if m.DeadLetterGrants == nil {
		m.DeadLetterGrants = d.DeadLetterGrants
	}
	if m.Callers == nil {
		m.Callers = d.Callers
	}
	m.AllowDuplicates = m.AllowDuplicates || d.AllowDuplicates
	m.AllowUndeclaredEmits = m.AllowUndeclaredEmits || d.AllowUndeclaredEmits
	m.SkipBodyValidation = m.SkipBodyValidation || d.SkipBodyValidation
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
	if c.ManagementURL != "" {
		if u, err := url.Parse(c.ManagementURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, errors.New("management_url: want http(s)://HOST:PORT"))
		}
	}
	if c.RetryMin < 0 || c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("retry_min/retry_max: want 0 <= min <= max, have %v and %v", c.RetryMin, c.RetryMax))
	}
	if c.CallTimeout < 0 {
		errs = append(errs, fmt.Errorf("call_timeout: %v is negative", c.CallTimeout))
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("reconnect_min/reconnect_max: want 0 <= min <= max, have %v and %v", c.ReconnectMin, c.ReconnectMax))
	}
	if c.SpoolMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("spool_max_bytes: %d is negative", c.SpoolMaxBytes))
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"lock_wait", c.LockWait}, {"emit_timeout", c.EmitTimeout}, {"consumer_timeout", c.ConsumerTimeout}, {"dedup_retention", c.DedupRetention}} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s: %v is negative", d.name, d.d))
		}
	}
	if c.DedupMaxEntries < 0 {
		errs = append(errs, fmt.Errorf("dedup_max_entries: %d is negative", c.DedupMaxEntries))
	}
	if err := checkBrokers(c.Brokers()); err != nil {
		errs = append(errs, err)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		errs = append(errs, errors.New("tls.cert_file/tls.key_file: give both or neither"))
	}
	if err := c.Module.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.History.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Identity.validate(c.Node, brokerUser(c.Brokers()[0])); err != nil {
		errs = append(errs, err)
	}
	if err := c.CheckConsumerTimeout(c.Module, true); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckConsumerTimeout refuses a module config under which a delivery could
// stay unacknowledged longer than the broker's consumer timeout: it may
// wait behind ceil(Prefetch/Concurrency)-1 handler runs and then run
// itself, each up to HandlerTimeout, and a failed event waits up to
// RetryMax before it is returned. The broker would close the channel of such a
// consumer. (The per-queue x-consumer-timeout argument is not enforced
// on RabbitMQ 3.10, so the runtime cannot lower the limit per queue.)
//
// Only a module that consumes events waits through other runs: tool
// requests are served up to the prefetch at once, and a consumed queue
// (sdk.Mesh.Consume) has as many workers as its prefetch. Pass
// consumesEvents false for a module known to do neither (an agent, or a
// module whose Setup subscribed no pattern): one run is then counted.
func (c Config) CheckConsumerTimeout(m ModuleConfig, consumesEvents bool) error {
	c.withDefaults()
	m = m.over(c.Module)
	// A delivery can wait behind the handler runs ahead of it: with
	// prefetch P and concurrency C, ceil(P/C) runs end with its own, each
	// up to the handler timeout, and a failed one is held for its retry.
	runs := 1
	if consumesEvents {
		runs = (m.Prefetch + m.Concurrency - 1) / m.Concurrency
	}
	backoff, what := c.RetryMax, "retry_max"
	if len(m.Retry) > 0 {
		backoff, what = c.heldRetry(m.Retry), "the longest held retry back-off"
	}
	if held := time.Duration(runs)*m.HandlerTimeout + backoff; held >= c.ConsumerTimeout {
		return fmt.Errorf("handler_timeout: %v for each of the %d handler runs a delivery can wait through (prefetch %d / concurrency %d), plus %s %v, "+
			"holds it for %v, not below the broker's consumer_timeout %v; lower handler_timeout, prefetch or the back-off, raise concurrency, "+
			"let retries of %v or more wait in the delay cascade (delays: true), or raise consumer_timeout here and on the broker (rabbitmq.conf consumer_timeout)",
			m.HandlerTimeout, runs, m.Prefetch, m.Concurrency, what, backoff, held, c.ConsumerTimeout, c.RetryScheduleFrom)
	}
	return nil
}

// scheduled reports whether a retry back-off of d goes through the delay
// cascade rather than being held.
func (c Config) scheduled(d time.Duration) bool {
	return c.Delays && d >= c.RetryScheduleFrom
}

// heldRetry is the longest back-off of retry that is held.
func (c Config) heldRetry(retry []time.Duration) time.Duration {
	var longest time.Duration
	for _, d := range retry {
		if !c.scheduled(d) {
			longest = max(longest, d)
		}
	}
	return longest
}

func (m ModuleConfig) validate() error {
	var errs []error
	if m.Group != "" {
		if err := wire.ValidateWord("group", m.Group); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case m.Partitions < 0 || m.Partitions > wire.Slots:
		errs = append(errs, fmt.Errorf("partitions: %d is not within 0..%d", m.Partitions, wire.Slots))
	case m.Partitions > 0 && m.Group == "":
		errs = append(errs, fmt.Errorf("partitions: %d needs group: order by key is a group's (a group of one node is one)", m.Partitions))
	case m.Partitions > 0 && m.QueueType != QueueQuorum:
		errs = append(errs, fmt.Errorf("partitions: %d needs queue_type %s: a partition hands over to its next consumer in order only as a quorum queue returns what its consumer held first", m.Partitions, QueueQuorum))
	}
	if _, err := parseOrderKey(m.OrderKey); err != nil {
		errs = append(errs, err)
	} else if m.OrderKey != "" && m.Partitions == 0 {
		errs = append(errs, fmt.Errorf("order_key: %q needs partitions: it keys a group that keeps order", m.OrderKey))
	}
	switch m.QueueType {
	case QueueQuorum, QueueClassic:
	default:
		errs = append(errs, fmt.Errorf("queue_type: %q is not %q or %q", m.QueueType, QueueQuorum, QueueClassic))
	}
	if m.Prefetch < 1 || m.Prefetch > 65535 {
		errs = append(errs, fmt.Errorf("prefetch: %d is not within 1..65535", m.Prefetch))
	}
	if m.MaxDelay < 0 || m.MaxDelay > delay.Max {
		errs = append(errs, fmt.Errorf("max_delay: %v is not within 0..%v (the cascade's longest)", m.MaxDelay, delay.Max))
	}
	if m.MaxScheduled < 0 {
		errs = append(errs, fmt.Errorf("max_scheduled: %d is negative", m.MaxScheduled))
	}
	if m.MaxScheduledBytes < 0 {
		errs = append(errs, fmt.Errorf("max_scheduled_bytes: %d is negative", m.MaxScheduledBytes))
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
	for i, r := range m.Retry {
		if r < 0 || r > delay.Max {
			errs = append(errs, fmt.Errorf("retry[%d]: %v is not within 0..%v (the longest delay)", i, r, delay.Max))
		}
	}
	if m.MaxPriority < 0 || m.MaxPriority > 9 {
		errs = append(errs, fmt.Errorf("max_priority: %d is not within 0..9", m.MaxPriority))
	}
	for i, g := range m.EmitGrants {
		if err := wire.ValidateSubscription(g); err != nil {
			errs = append(errs, fmt.Errorf("emit_grants[%d]: %w", i, err))
		}
	}
	for i, g := range m.ToolGrants {
		if err := wire.ValidatePattern(g); err != nil {
			errs = append(errs, fmt.Errorf("tools[%d]: %w", i, err)) // the key in mesh.yaml
		}
	}
	for _, list := range []struct {
		key      string
		patterns []string
		validate func(string) error
	}{{"calls", m.CallGrants, wire.ValidatePattern}, {"consumes", m.ConsumeGrants, wire.ValidatePattern}, {"dead_letters", m.DeadLetterGrants, wire.ValidateSubscription}} {
		for i, g := range list.patterns {
			if err := list.validate(g); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", list.key, i, err))
			}
		}
	}
	for _, tool := range slices.Sorted(maps.Keys(m.Callers)) {
		if err := wire.ValidatePattern(tool); err != nil {
			errs = append(errs, fmt.Errorf("callers[%q]: %w", tool, err))
		}
		for i, c := range m.Callers[tool] {
			if err := ValidateCallerPattern(c); err != nil {
				errs = append(errs, fmt.Errorf("callers[%q][%d]: %w", tool, i, err))
			}
		}
	}
	if m.MaxPriority > 0 && m.QueueType != QueueClassic {
		errs = append(errs, fmt.Errorf("max_priority: only a classic queue honours priorities; set queue_type to %q or max_priority to 0", QueueClassic))
	}
	return errors.Join(errs...)
}

// Brokers are the broker's addresses, in the order configured: AMQPURL
// (if set), then AMQPURLs, each once; DefaultAMQPURL if neither is set.
func (c Config) Brokers() []string {
	var out []string
	for _, u := range append([]string{c.AMQPURL}, c.AMQPURLs...) {
		if u != "" && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		out = []string{DefaultAMQPURL}
	}
	return out
}

// checkBrokers refuses an address that is not an amqp:// or amqps:// URL,
// and addresses that name different users (an event's user-id must be the
// user of whichever connection publishes it). Errors show addresses
// without their passwords.
func checkBrokers(urls []string) error {
	var errs []error
	user, first := "", ""
	for _, u := range urls {
		uri, err := amqp.ParseURI(u)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // url.Error quotes the URL, password and all
			}
			errs = append(errs, fmt.Errorf("amqp_url/amqp_urls: %s: %w", redactURL(u), err))
			continue
		}
		switch {
		case first == "":
			user, first = uri.Username, u
		case uri.Username != user:
			errs = append(errs, fmt.Errorf("amqp_url/amqp_urls: %s uses the user %q and %s uses %q: every address must use the same user (an event's user-id is checked against it)",
				redactURL(u), uri.Username, redactURL(first), user))
		}
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

// Resolved is c as a node runs with it: every zero field that has a
// default takes it. Validate checks the same.
func (c Config) Resolved() Config {
	c.withDefaults()
	return c
}
