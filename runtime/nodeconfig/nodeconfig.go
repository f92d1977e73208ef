// Package nodeconfig reads a node's configuration file (mesh.yaml): the
// node, its broker, its state dir, defaults for its modules, and the
// module binaries it runs. Environment variables and flags override the
// file; Validate names every field that breaks a rule.
//
//	f, err := nodeconfig.Load("mesh.yaml")
//	if err != nil {
//		return err // "mesh.yaml: modules[1].path: is empty"
//	}
//
// Settings lists every key with its environment variable, meshd flag,
// default and bounds; WriteReference writes them as the configuration
// reference (docs/config.md, `meshd config reference`), and tests hold
// both to the code. Permissions computes a node's least-privilege broker
// permissions from its file.
package nodeconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/runtime"
)

// File is a node's configuration file.
type File struct {
	Node    string `yaml:"node"`
	AMQPURL string `yaml:"amqp_url"`
	// AMQPURLs are more addresses of the broker, the nodes of a cluster
	// (runtime.Config.AMQPURLs).
	AMQPURLs []string `yaml:"amqp_urls"`
	// AMQPPasswordFile holds the broker user's password, set into every
	// broker URL by ApplyPasswordFile.
	AMQPPasswordFile string `yaml:"amqp_password_file"`
	StateDir         string `yaml:"state_dir"`
	// HTTPAddr serves /healthz and /readyz when set (host:port).
	HTTPAddr     string        `yaml:"http_addr"`
	MaxBodyBytes int           `yaml:"max_body_bytes"`
	CallTimeout  time.Duration `yaml:"call_timeout"`
	RetryMin     time.Duration `yaml:"retry_min"`
	RetryMax     time.Duration `yaml:"retry_max"`
	Grace        time.Duration `yaml:"grace"`
	// TLS names the PEM files of an amqps:// broker URL.
	TLS TLS `yaml:"tls"`
	// ConsumerTimeout must match the broker's consumer_timeout (default 30
	// min); a handler_timeout plus retry_max that reaches it is refused.
	ConsumerTimeout time.Duration `yaml:"consumer_timeout"`
	// SpoolMaxBytes bounds the local spool of unconfirmed events (default
	// 256 MiB); past it emits fail with back-pressure.
	SpoolMaxBytes int64 `yaml:"spool_max_bytes"`
	// EmitTimeout bounds how long an emit retries while the broker refuses
	// it (default 30s).
	EmitTimeout  time.Duration `yaml:"emit_timeout"`
	ReconnectMin time.Duration `yaml:"reconnect_min"`
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// LockWait is how long a reconnecting node waits for its old node
	// lock to be released (default 30s).
	LockWait time.Duration `yaml:"lock_wait"`
	// DedupRetention and DedupMaxEntries bound the record of handled
	// event ids each module keeps (defaults 24h and 1,000,000).
	DedupRetention  time.Duration `yaml:"dedup_retention"`
	DedupMaxEntries int           `yaml:"dedup_max_entries"`
	// HeartbeatInterval is how often the node tells the mesh it runs, with
	// its modules (node.NODE.heartbeat), and checks that the others do
	// (default 10s; -1s turns membership off).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Delays declares the delay cascade and runs the node's mover, for
	// delayed emits (sdk.After, sdk.At); default true.
	Delays *bool `yaml:"delays"`
	// QueuePolicies keeps the attempt limits of the node's queues in
	// policies, so max_attempts changes in place (runtime.Config.
	// QueuePolicies; ADR 43); default true, used where the broker user may
	// set policies.
	QueuePolicies *bool `yaml:"queue_policies"`
	// QueueLimitPolicyOnly declares new queues' attempt limits in their
	// policies alone (runtime.Config.QueueLimitPolicyOnly); default
	// false while v0.1.0, which cannot declare such a queue, is in the
	// release window.
	QueueLimitPolicyOnly bool `yaml:"queue_limit_policy_only"`
	// ManagementURL is the broker's management API, for QueuePolicies
	// (default the AMQP host's port 15672).
	ManagementURL string `yaml:"management_url"`
	// DelayPublishers are broker users besides the node's own whose
	// schedules its mover delivers (meshctl emit --after --via NODE as the
	// operator's user).
	DelayPublishers []string `yaml:"delay_publishers"`
	// History names the stream that keeps the mesh's history, replicated
	// on the broker, for the audit logger (runtime.HistoryConfig; ADR 35).
	History History `yaml:"history"`
	// Identity ties each node's name (x-node) to its broker user
	// (user-id): runtime.IdentityConfig.
	Identity Identity `yaml:"identity"`
	// Defaults apply to every module unless it says otherwise.
	Defaults Module   `yaml:"defaults"`
	Modules  []Module `yaml:"modules"`
}

// Module is one module binary the node runs, and how it consumes.
type Module struct {
	// Name is the name the module must report; a binary that says another
	// name is refused, so the config cannot silently run the wrong one.
	Name string `yaml:"name"`
	Kind string `yaml:"kind"`
	// User is who the module's process runs as: "auto" for a user of its
	// own that meshd picks (as systemd's DynamicUser does), a user name,
	// "UID[:GID]", or "root". Any user but meshd's own needs meshd to run
	// as root (or with CAP_SETUID and CAP_SETGID). "" is auto where meshd
	// runs as root and meshd's own user elsewhere.
	User string   `yaml:"user"`
	Path string   `yaml:"path"`
	Args []string `yaml:"args"`
	// Required makes meshd exit when the module does not load or start;
	// by default meshd reports it and tries it again with back-off while
	// the node and its other modules run.
	Required bool `yaml:"required"`
	// Group makes the module's copies on every node whose entry names the
	// same group one group: they share group.GROUP.NAME.events and
	// compete for its events (runtime.ModuleConfig.Group; ADR 48). Each
	// entry says it; defaults cannot.
	Group string `yaml:"group"`
	// Partitions makes the group keep order by key over that many
	// partitions (runtime.ModuleConfig.Partitions).
	Partitions int `yaml:"partitions"`
	// OrderKey is the group's rule for an event's key: source, or
	// body.FIELD (runtime.ModuleConfig.OrderKey).
	OrderKey  string `yaml:"order_key"`
	QueueType string `yaml:"queue_type"`
	Prefetch  int    `yaml:"prefetch"`
	// Concurrency is how many handler calls run at once (1 to prefetch,
	// default 1: in queue order), in a module process as in-process.
	Concurrency    int           `yaml:"concurrency"`
	MaxAttempts    int           `yaml:"max_attempts"`
	HandlerTimeout time.Duration `yaml:"handler_timeout"`
	// Retry is the back-off before each retry of a failed event, in order
	// ([10s, 1m, 1h]); the long ones wait in the delay cascade without
	// holding the delivery (runtime.ModuleConfig.Retry).
	Retry       []time.Duration `yaml:"retry"`
	MaxPriority int             `yaml:"max_priority"`
	// MaxDelay, MaxScheduled and MaxScheduledBytes bound what the module
	// schedules (runtime.ModuleConfig.MaxDelay).
	MaxDelay          time.Duration `yaml:"max_delay"`
	MaxScheduled      int           `yaml:"max_scheduled"`
	MaxScheduledBytes int64         `yaml:"max_scheduled_bytes"`
	// EmitGrants are patterns of full event types under mesh. or node. the
	// module may emit (sdk.AsFullType).
	EmitGrants []string `yaml:"emit_grants"`
	// Tools are patterns of the tool keys the module may serve; a module
	// process serves none that are not listed.
	Tools []string `yaml:"tools"`
	// Calls are patterns of the tool keys the module may call; a call of
	// any other is refused by the host (default: none).
	Calls []string `yaml:"calls"`
	// Consumes are patterns of the names of existing broker queues the
	// module may consume (sdk.Mesh.Consume; default: none).
	Consumes []string `yaml:"consumes"`
	// DeadLetters are patterns of the event types whose dead letters the
	// module may receive (a DeadLetters handler; default: none).
	DeadLetters []string `yaml:"dead_letters"`
	// Callers says who may call each tool the module serves: tool key
	// pattern → callers ("billing", "berlin/billing", "*/meshctl",
	// "user:ops"). It replaces the module's own default for the tools it
	// matches; a tool neither names may be called by anyone.
	Callers map[string][]string `yaml:"callers"`
	// History grants the module the mesh's history (a History handler:
	// the audit logger), from the stream under history: (default false).
	History bool `yaml:"history"`
	// AllowDuplicates turns off de-duplication by event id for the module.
	AllowDuplicates bool `yaml:"allow_duplicates"`
	// AllowUndeclaredEmits lets the module emit event names it does not
	// declare (by default refused).
	AllowUndeclaredEmits bool `yaml:"allow_undeclared_emits"`
	// SkipBodyValidation does not validate the module's emitted bodies
	// against its declared schemas (x-schema is still set from them).
	SkipBodyValidation bool `yaml:"skip_body_validation"`
	// Network is what the module process may reach over the network:
	// nothing by default (docs/security.md).
	Network Network `yaml:"network"`
	// Config is the module's own settings (the dispatcher's triggers, the
	// agent's tools), handed to the module process as JSON
	// (sdk/process.Settings). Not taken from defaults.
	Config any `yaml:"config"`
}

// checkUser checks the form of a module entry's user: (meshd resolves it
// when it starts the module).
func checkUser(u string) error {
	if strings.ContainsFunc(u, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '/' }) {
		return fmt.Errorf("%q is not auto, root, a user name or UID[:GID]", u)
	}
	return nil
}

// OperatorCaller is the caller name meshctl's calls carry (x-source): no
// module may be named so, so "meshctl" in a tool's callers is the
// operator.
const OperatorCaller = "meshctl"

// History is the history's stream (runtime.HistoryConfig): every node of
// the mesh says the same.
type History struct {
	Stream       string        `yaml:"stream"`
	MaxAge       time.Duration `yaml:"max_age"`
	MaxBytes     int64         `yaml:"max_bytes"`
	SegmentBytes int64         `yaml:"segment_bytes"`
	Replicas     int           `yaml:"replicas"`
}

// Identity is the node's identity rule (runtime.IdentityConfig): what it
// does with an event or a tool request whose x-node another broker user
// published than the one users (or user_pattern) names for that node.
type Identity struct {
	Mode        string            `yaml:"mode"`
	Users       map[string]string `yaml:"users"`
	UserPattern string            `yaml:"user_pattern"`
	Operators   []string          `yaml:"operators"`
}

// TLS names the PEM files of an amqps:// connection.
type TLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// Load reads and decodes path; unknown fields are errors. It does not
// validate: apply the environment and flags first, then Validate.
func Load(path string) (File, error) {
	var f File
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("read config: %w", err)
	}
	// The shape first: its errors speak mesh.yaml's terms (shape.go).
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	if err := checkShape(&doc); err != nil {
		return f, fmt.Errorf("%s:\n%w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); errors.Is(err, io.EOF) {
		return f, fmt.Errorf("%s: the file is empty (examples/mesh.yaml and docs/config.md show what it holds)", path)
	} else if err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// ApplyPasswordFile reads AMQPPasswordFile, if set, and sets the password
// it holds (its first line) into AMQPURL and every AMQPURLs (the default
// URL when neither is set), so the password need not appear in the file,
// the environment or argv.
func (f *File) ApplyPasswordFile() error {
	if f.AMQPPasswordFile == "" {
		return nil
	}
	b, err := os.ReadFile(f.AMQPPasswordFile)
	if err != nil {
		return fmt.Errorf("amqp_password_file: %w", err)
	}
	password, _, _ := strings.Cut(string(b), "\n")
	password = strings.TrimSuffix(password, "\r")
	if password == "" {
		return fmt.Errorf("amqp_password_file: %s holds no password on its first line", f.AMQPPasswordFile)
	}
	set := func(raw string) (string, error) {
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			return raw, nil // Validate names what is wrong with the URL
		}
		u.User = url.UserPassword(u.User.Username(), password)
		return u.String(), nil
	}
	if f.AMQPURL == "" && len(f.AMQPURLs) == 0 {
		f.AMQPURL = runtime.DefaultAMQPURL
	}
	if f.AMQPURL != "" {
		f.AMQPURL, _ = set(f.AMQPURL)
	}
	for i := range f.AMQPURLs {
		f.AMQPURLs[i], _ = set(f.AMQPURLs[i])
	}
	return nil
}

// Runtime is the node's runtime configuration from the file.
func (f File) Runtime() runtime.Config {
	return runtime.Config{
		Node: f.Node, AMQPURL: f.AMQPURL, AMQPURLs: f.AMQPURLs, StateDir: f.StateDir, MaxBodyBytes: f.MaxBodyBytes,
		CallTimeout: f.CallTimeout, RetryMin: f.RetryMin, RetryMax: f.RetryMax,
		Module:          f.Defaults.runtime(),
		TLS:             runtime.TLSConfig{CAFile: f.TLS.CAFile, CertFile: f.TLS.CertFile, KeyFile: f.TLS.KeyFile, ServerName: f.TLS.ServerName},
		ConsumerTimeout: f.ConsumerTimeout, SpoolMaxBytes: f.SpoolMaxBytes, EmitTimeout: f.EmitTimeout,
		ReconnectMin: f.ReconnectMin, ReconnectMax: f.ReconnectMax, LockWait: f.LockWait,
		DedupRetention: f.DedupRetention, DedupMaxEntries: f.DedupMaxEntries,
		HeartbeatInterval:    f.heartbeatInterval(),
		Delays:               f.Delays == nil || *f.Delays,
		DelayPublishers:      f.DelayPublishers,
		QueuePolicies:        f.QueuePolicies == nil || *f.QueuePolicies,
		QueueLimitPolicyOnly: f.QueueLimitPolicyOnly,
		ManagementURL:        f.ManagementURL,
		History: runtime.HistoryConfig{Stream: f.History.Stream, MaxAge: f.History.MaxAge, MaxBytes: f.History.MaxBytes,
			SegmentBytes: f.History.SegmentBytes, Replicas: f.History.Replicas},
		Identity: runtime.IdentityConfig{Mode: f.Identity.Mode, Users: f.Identity.Users, UserPattern: f.Identity.UserPattern,
			Operators: f.Identity.Operators},
	}
}

// heartbeatInterval is the node's: the file's, or by default
// runtime.DefaultHeartbeatInterval (a negative one turns membership off).
func (f File) heartbeatInterval() time.Duration {
	if f.HeartbeatInterval == 0 {
		return runtime.DefaultHeartbeatInterval
	}
	return f.HeartbeatInterval
}

// ModuleConfig is how module m consumes, and what it is granted; a module
// process may serve only the tools listed.
func (m Module) ModuleConfig() runtime.ModuleConfig {
	mc := m.runtime()
	mc.ToolGrants = append([]string{}, m.Tools...) // never nil: default deny
	mc.CallGrants = append([]string{}, mc.CallGrants...)
	mc.ConsumeGrants = append([]string{}, mc.ConsumeGrants...)
	mc.DeadLetterGrants = append([]string{}, mc.DeadLetterGrants...)
	mc.Name = m.Name
	if m.Config != nil {
		mc.Settings, _ = json.Marshal(m.Config) // checked by Validate
	}
	return mc
}

func (m Module) runtime() runtime.ModuleConfig {
	return runtime.ModuleConfig{
		QueueType: m.QueueType, Prefetch: m.Prefetch, Concurrency: m.Concurrency, MaxAttempts: m.MaxAttempts,
		HandlerTimeout: m.HandlerTimeout, Retry: m.Retry, MaxPriority: m.MaxPriority, EmitGrants: m.EmitGrants,
		MaxDelay: m.MaxDelay, MaxScheduled: m.MaxScheduled, MaxScheduledBytes: m.MaxScheduledBytes,
		AllowDuplicates: m.AllowDuplicates, AllowUndeclaredEmits: m.AllowUndeclaredEmits,
		SkipBodyValidation: m.SkipBodyValidation, DenyHistory: !m.History, Group: m.Group, Partitions: m.Partitions, OrderKey: m.OrderKey,
		CallGrants: m.Calls, ConsumeGrants: m.Consumes, DeadLetterGrants: m.DeadLetters, Callers: m.Callers,
	}
}

// Validate checks the whole configuration and returns every problem, each
// naming its field.
func (f File) Validate() error {
	var errs []error
	if err := f.Runtime().Validate(); err != nil {
		errs = append(errs, err)
	}
	if f.Defaults.History {
		errs = append(errs, errors.New("defaults.history: the history is granted module by module (history: true in an entry)"))
	}
	if f.Defaults.Required {
		errs = append(errs, errors.New("defaults.required: a module is required entry by entry (required: true in an entry)"))
	}
	if f.Defaults.OrderKey != "" {
		errs = append(errs, errors.New("defaults.order_key: a group's key is given entry by entry (order_key: in an entry)"))
	}
	if f.Defaults.Partitions != 0 {
		errs = append(errs, errors.New("defaults.partitions: a group keeps order entry by entry (partitions: N in an entry)"))
	}
	if f.Defaults.Group != "" {
		errs = append(errs, errors.New("defaults.group: a module joins a group entry by entry (group: NAME in an entry)"))
	}
	if f.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(f.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("http_addr: %w", err))
		}
	}
	if f.AMQPPasswordFile != "" {
		if _, err := os.ReadFile(f.AMQPPasswordFile); err != nil {
			errs = append(errs, fmt.Errorf("amqp_password_file: %w", err))
		}
	}
	if f.Grace < 0 {
		errs = append(errs, fmt.Errorf("grace: %v is negative", f.Grace))
	}
	if f.Defaults.Name != "" || f.Defaults.Path != "" || len(f.Defaults.Args) > 0 || f.Defaults.Config != nil || f.Defaults.User != "" {
		errs = append(errs, errors.New("defaults: name, path, args, user and config belong to each module, not to the defaults"))
	}
	if len(f.Defaults.Network.Connect)+len(f.Defaults.Network.Bind) > 0 {
		errs = append(errs, errors.New("defaults.network: the network is granted module by module (network: in an entry)"))
	}
	names := make(map[string]int)
	for i, m := range f.Modules {
		field := fmt.Sprintf("modules[%d]", i)
		if err := wire.ValidateWord("module name", m.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s.name: %w", field, err))
		} else if strings.Contains(m.Name, "/") {
			errs = append(errs, fmt.Errorf("%s.name: %q contains '/', which a tool's callers use between node and module (NODE/MODULE)", field, m.Name))
		} else if m.Name == OperatorCaller {
			errs = append(errs, fmt.Errorf("%s.name: %q is the operator's name as a caller (meshctl); a module may not take it", field, m.Name))
		} else if j, dup := names[m.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name: %q is already modules[%d]", field, m.Name, j))
		} else {
			names[m.Name] = i
		}
		switch m.Kind {
		case "", "dispatcher", "agent":
		default:
			hint := ""
			if near := nearest(m.Kind, map[string]reflect.Type{"dispatcher": nil, "agent": nil}); near != "" {
				hint = "; did you mean " + near + "?"
			}
			errs = append(errs, fmt.Errorf("%s.kind: %q is not a kind of module: leave it out for a module of your own, or say dispatcher or agent for the shipped ones%s", field, m.Kind, hint))
		}
		if err := checkUser(m.User); err != nil {
			errs = append(errs, fmt.Errorf("%s.user: %w", field, err))
		}
		if m.Path == "" {
			errs = append(errs, fmt.Errorf("%s.path: is empty", field))
		} else if st, err := os.Stat(m.Path); err != nil {
			errs = append(errs, fmt.Errorf("%s.path: %w", field, err))
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s.path: %s is not an executable file", field, m.Path))
		}
		if _, _, err := m.Network.Parse(); err != nil {
			errs = append(errs, fmt.Errorf("%s.network.%w", field, err))
		}
		if m.Config != nil {
			if _, err := json.Marshal(m.Config); err != nil {
				errs = append(errs, fmt.Errorf("%s.config: cannot be passed to the module as JSON: %w", field, err))
			}
		}
		if m.Kind == "dispatcher" {
			errs = append(errs, f.checkTriggerTimeouts(field, m)...)
		}
		cfg := runtime.Config{Node: "x", Module: m.ModuleConfig(), RetryMin: f.RetryMin, RetryMax: f.RetryMax, ConsumerTimeout: f.ConsumerTimeout,
			Delays: f.Runtime().Delays}
		if err := cfg.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		} else if err := f.Runtime().CheckConsumerTimeout(m.ModuleConfig(), m.Kind != "agent"); err != nil {
			errs = append(errs, fmt.Errorf("%s.%w", field, err))
		}
	}
	return errors.Join(errs...)
}

// checkTriggerTimeouts refuses a dispatcher trigger whose timeout the
// module's handler timeout would cut: the handler timeout is what is held
// against the broker's consumer timeout (CheckConsumerTimeout), so a
// longer call is raised there, with consumer_timeout if need be.
func (f File) checkTriggerTimeouts(field string, m Module) []error {
	var cfg struct {
		Triggers []struct {
			Timeout any `json:"timeout"`
		} `json:"triggers"`
	}
	raw, err := json.Marshal(m.Config)
	if err != nil || json.Unmarshal(raw, &cfg) != nil {
		return nil // the dispatcher names what is wrong with its config
	}
	handler := m.HandlerTimeout
	if handler == 0 {
		handler = f.Defaults.HandlerTimeout
	}
	if handler == 0 {
		handler = runtime.DefaultHandlerTimeout
	}
	var errs []error
	for i, t := range cfg.Triggers {
		d := 30 * time.Second // the dispatcher's default
		switch v := t.Timeout.(type) {
		case string:
			if d, err = time.ParseDuration(v); err != nil {
				continue // the dispatcher says so
			}
		case float64:
			d = time.Duration(v)
		}
		if d > handler {
			errs = append(errs, fmt.Errorf("%s.config.triggers[%d].timeout: %v is longer than the module's handler_timeout %v, which would cut every call; "+
				"raise handler_timeout (and, past the broker's consumer timeout, consumer_timeout here and in rabbitmq.conf)", field, i, d, handler))
		}
	}
	return errs
}
