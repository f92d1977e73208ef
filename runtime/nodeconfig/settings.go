package nodeconfig

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/meshkit/mesh/runtime"
)

// Where a setting goes in mesh.yaml.
const (
	// ScopeNode is a top-level key of mesh.yaml.
	ScopeNode = "node"
	// ScopeModule is a key of each modules[] entry and of defaults:, which
	// sets it for every module that does not set it.
	ScopeModule = "module"
	// ScopeEntry is a key of each modules[] entry only.
	ScopeEntry = "entry"
	// ScopeProcess is meshd's alone: a flag or environment variable with no
	// key in mesh.yaml.
	ScopeProcess = "process"
)

// DefaultGrace is how long meshd lets in-flight handlers finish when it
// stops, unless grace says otherwise.
const DefaultGrace = 30 * time.Second

// Setting is one setting of a node, as the configuration reference
// (docs/config.md, `meshd config reference`) shows it. Tests hold it to
// the code: every key of File has a Setting, meshd's flags and environment
// variables are the ones listed, a key set to its Default changes nothing,
// and Validate accepts each of Valid and refuses each of Invalid, naming
// the key.
type Setting struct {
	// Key is the setting's key in mesh.yaml ("tls.ca_file"); empty for a
	// ScopeProcess setting.
	Key string
	// Scope is ScopeNode, ScopeModule, ScopeEntry or ScopeProcess.
	Scope string
	// Env is the environment variable that overrides the file, if any.
	Env string
	// Flag is meshd run's flag (without dashes) that overrides the
	// environment, if any.
	Flag string
	// Default is the value a node takes when the setting is not given,
	// as it would be written in mesh.yaml; empty when there is none.
	Default string
	// DefaultInWords is true when Default describes the default rather
	// than being a value ("the system's roots").
	DefaultInWords bool
	// Bounds are the values Validate accepts, in words.
	Bounds string
	// Doc says what the setting does.
	Doc string
	// Valid are values Validate accepts (at the bounds), and Invalid are
	// values it refuses; both as written in mesh.yaml.
	Valid, Invalid []string
}

// Settings lists every setting of a node, in the order of the reference.
func Settings() []Setting {
	d := formatDuration
	n := strconv.Itoa
	return []Setting{
		{Key: "node", Scope: ScopeNode, Env: "MESH_NODE", Flag: "node", Bounds: "one word: no dot, *, #, whitespace or control character; required",
			Doc:   "This node's name, unique on the mesh. A second meshd with the same name on the same broker refuses to start.",
			Valid: []string{"anchor"}, Invalid: []string{`"two words"`, `"a.b"`}},
		{Key: "amqp_url", Scope: ScopeNode, Env: "MESH_AMQP_URL", Flag: "amqp-url", Default: runtime.DefaultAMQPURL, Bounds: "an amqp:// or amqps:// URL",
			Doc:   "The broker, `amqp://user:password@host:port/vhost`. Its password never appears in logs, errors or metrics.",
			Valid: []string{"amqp://guest:guest@127.0.0.1:5672/"}, Invalid: []string{"http://127.0.0.1/"}},
		{Key: "amqp_password_file", Scope: ScopeNode, Env: "MESH_AMQP_PASSWORD_FILE", Flag: "amqp-password-file", Bounds: "a readable file",
			Doc:     "A file holding the broker user's password (one line), set into every broker URL in place of theirs, so the password need not be in the config, the environment or argv (where ps shows it). Readable by meshd's user alone.",
			Invalid: []string{"/nonexistent/password"}},
		{Key: "amqp_urls", Scope: ScopeNode, Env: "MESH_AMQP_URLS", Flag: "amqp-urls", Bounds: "amqp:// or amqps:// URLs, all with the same user",
			Doc: "More addresses of the broker: the nodes of a RabbitMQ cluster (comma-separated in the environment). The node uses one at a time, " +
				"starting at a random place in the list, and moves to the next when a connection is lost (ADR 26, docs/clusters.md).",
			Valid: []string{`["amqp://guest:guest@127.0.0.1:5701/", "amqp://guest:guest@127.0.0.1:5702/"]`}, Invalid: []string{`["amqp://guest:guest@127.0.0.1:5701/", "amqp://other:x@127.0.0.1:5702/"]`}},
		{Key: "state_dir", Scope: ScopeNode, Env: "MESH_STATE_DIR", Flag: "state-dir", DefaultInWords: true, Default: "$XDG_STATE_HOME/mesh/NODE or ~/.local/state/mesh/NODE", Bounds: "a directory one node process uses at a time",
			Doc: "Node-local state: the spool of unconfirmed emits (spool.db), each module's record of handled event ids (dedup/) and binding records (bindings/). Back it up with the node stopped."},
		{Key: "http_addr", Scope: ScopeNode, Env: "MESH_HTTP_ADDR", Flag: "http-addr", DefaultInWords: true, Default: "off", Bounds: "host:port",
			Doc: "Serves /healthz, /readyz and /metrics (Prometheus) on this address. A port without a host (`:9464`) listens on loopback only, 127.0.0.1; " +
				"listening on every interface takes an explicit `0.0.0.0:9464` or `[::]:9464` (what /metrics and /readyz answer names the node's modules and queues).",
			Valid: []string{`"127.0.0.1:9464"`, `":9464"`, `"0.0.0.0:9464"`}, Invalid: []string{`"no-port"`}},
		{Key: "max_body_bytes", Scope: ScopeNode, Default: n(runtime.DefaultMaxBodyBytes), Bounds: "0 or more",
			Doc: "Emits with a bigger body are refused with ErrInvalid.", Valid: []string{"1"}, Invalid: []string{"-1"}},
		{Key: "call_timeout", Scope: ScopeNode, Default: d(runtime.DefaultCallTimeout), Bounds: "0 or more",
			Doc: "A tool call's deadline when its context has none.", Valid: []string{"1s"}, Invalid: []string{"-1s"}},
		{Key: "retry_min", Scope: ScopeNode, Default: d(runtime.DefaultRetryMin), Bounds: "0 ≤ retry_min ≤ retry_max",
			Doc: "The shortest back-off before a failed event is handled again.", Valid: []string{"0s", "30s"}, Invalid: []string{"-1s", "31s"}},
		{Key: "retry_max", Scope: ScopeNode, Default: d(runtime.DefaultRetryMax), Bounds: "retry_min ≤ retry_max; plus a module's handler runs, below consumer_timeout",
			Doc: "The longest back-off before a failed event is handled again.", Valid: []string{"200ms"}, Invalid: []string{"100ms"}},
		{Key: "grace", Scope: ScopeNode, Env: "MESH_GRACE", Flag: "grace", Default: d(DefaultGrace), Bounds: "0 or more",
			Doc: "On SIGTERM, how long in-flight handlers may finish. What is not finished goes back to its queue.", Valid: []string{"1s"}, Invalid: []string{"-1s"}},
		{Key: "tls.ca_file", Scope: ScopeNode, Env: "MESH_TLS_CA_FILE", Flag: "tls-ca-file", DefaultInWords: true, Default: "the system's roots",
			Doc: "PEM file of the CA that signed the broker's certificate, for amqps:// addresses."},
		{Key: "tls.cert_file", Scope: ScopeNode, Env: "MESH_TLS_CERT_FILE", Flag: "tls-cert-file", Bounds: "with tls.key_file, or neither",
			Doc: "PEM file of the node's client certificate (certificate authentication).", Invalid: []string{"cert.pem"}},
		{Key: "tls.key_file", Scope: ScopeNode, Env: "MESH_TLS_KEY_FILE", Flag: "tls-key-file", Bounds: "with tls.cert_file, or neither",
			Doc: "PEM file of the client certificate's key.", Invalid: []string{"key.pem"}},
		{Key: "tls.server_name", Scope: ScopeNode, Env: "MESH_TLS_SERVER_NAME", Flag: "tls-server-name", DefaultInWords: true, Default: "the host of the broker URL",
			Doc: "The name checked in the broker's certificate.", Valid: []string{"rabbit.example.net"}},
		{Key: "consumer_timeout", Scope: ScopeNode, Default: d(runtime.DefaultConsumerTimeout), Bounds: "0 or more; above every module's handler runs plus retry_max",
			Doc:   "Must equal the broker's consumer_timeout (rabbitmq.conf). A module that could hold a delivery longer is refused at start, because the broker would close its channel.",
			Valid: []string{"1h"}, Invalid: []string{"-1s", "1m"}},
		{Key: "spool_max_bytes", Scope: ScopeNode, Default: strconv.FormatInt(runtime.DefaultSpoolMaxBytes, 10), Bounds: "0 or more",
			Doc: "Bounds the local spool of events the broker has not confirmed; past it emits fail with sdk.ErrTransient (back-pressure).", Valid: []string{"1"}, Invalid: []string{"-1"}},
		{Key: "emit_timeout", Scope: ScopeNode, Default: d(runtime.DefaultEmitTimeout), Bounds: "0 or more",
			Doc:   "How long an emit without a deadline retries while the broker refuses it (a queue at its length limit) before it fails with sdk.ErrTransient (refused by the broker); a spooled event is dead-lettered after it.",
			Valid: []string{"1s"}, Invalid: []string{"-1s"}},
		{Key: "reconnect_min", Scope: ScopeNode, Default: d(runtime.DefaultReconnectMin), Bounds: "0 ≤ reconnect_min ≤ reconnect_max",
			Doc: "The shortest back-off between attempts to reach the broker.", Valid: []string{"0s"}, Invalid: []string{"-1s", "11s"}},
		{Key: "reconnect_max", Scope: ScopeNode, Default: d(runtime.DefaultReconnectMax), Bounds: "reconnect_min ≤ reconnect_max",
			Doc: "The longest back-off between attempts to reach the broker.", Valid: []string{"100ms"}, Invalid: []string{"50ms"}},
		{Key: "lock_wait", Scope: ScopeNode, Default: d(runtime.DefaultLockWait), Bounds: "0 or more",
			Doc: "How long a reconnecting node, or one started again after a run that did not stop cleanly (killed), waits for the broker to release its old node lock before it concludes another node of its name runs.", Valid: []string{"1s"}, Invalid: []string{"-1s"}},
		{Key: "dedup_retention", Scope: ScopeNode, Default: d(runtime.DefaultDedupRetention), Bounds: "0 or more",
			Doc: "How long a module remembers the ids of events it handled, to acknowledge a redelivery without handling it again.", Valid: []string{"1h"}, Invalid: []string{"-1s"}},
		{Key: "dedup_max_entries", Scope: ScopeNode, Default: n(runtime.DefaultDedupMaxEntries), Bounds: "0 or more",
			Doc: "How many handled ids each module remembers, oldest forgotten first (about 80 MB per module when full).", Valid: []string{"1"}, Invalid: []string{"-1"}},
		{Key: "heartbeat_interval", Scope: ScopeNode, Default: d(runtime.DefaultHeartbeatInterval), Bounds: "a negative value turns membership off",
			Doc:   "How often the node sends node.NODE.heartbeat with its modules, which meshctl nodes and meshctl graph read. A peer silent for 3 of its intervals is reported once as node.PEER.unreachable. It is also how often the node reads the depth and consumers of its modules' queues from the broker, for the metrics mesh_queue_depth and mesh_queue_consumers (every 10s while membership is off).",
			Valid: []string{"2s", "-1s"}},
		{Key: "delays", Scope: ScopeNode, Default: "true", Bounds: "true or false",
			Doc:   "Declares the delay cascade on the broker (mesh.delay and 28 quorum queues mesh.delay.27 … mesh.delay.00, ADR 32) and runs the node's mover, which publishes delayed events (sdk.After, sdk.At) when they come due. A delayed emit needs it on the emitting node; any node with it on delivers what comes due.",
			Valid: []string{"false"}},
		{Key: "queue_policies", Scope: ScopeNode, Default: "true", Bounds: "true or false",
			Doc:   "Keeps the attempt limit (max_attempts) of the node's quorum queues in a policy per queue (mesh.queue.QUEUE, priority 100), so a lower max_attempts applies on reload to the queue with its messages in place (ADR 43); a new queue is declared with the argument x-delivery-limit as well, as v0.1.0 declares it, unless queue_limit_policy_only, so a higher one needs meshctl queue migrate. It needs the management API and a broker user tagged policymaker (or administrator); without them the node declares the argument as v0.1.0 did, and says so once. A queue declared with the argument keeps it: its policy can lower the limit, and meshctl queue migrate moves it to a limit by policy.",
			Valid: []string{"false"}},
		{Key: "queue_limit_policy_only", Scope: ScopeNode, Default: "false", Bounds: "true or false",
			Doc:   "With queue_policies in force, declares a new quorum queue's attempt limit in its policy alone, without the argument x-delivery-limit, so that a higher max_attempts applies in place too (a policy can only lower an argument's limit; a higher one then needs meshctl queue migrate). Off by default while v0.1.0 is in the release window: its meshd declares x-delivery-limit and stops on a queue declared without it (406 inequivalent arg), so a node whose queues were declared with this on cannot be rolled back to v0.1.0 (docs/compatibility.md).",
			Valid: []string{"true"}},
		{Key: "management_url", Scope: ScopeNode, DefaultInWords: true, Default: "the broker's host, port 15672 (15671 for amqps://)", Bounds: "http(s)://HOST:PORT",
			Doc:   "The broker's management API, which the node uses to keep its queues' policies (queue_policies), with the broker URL's user.",
			Valid: []string{"http://127.0.0.1:15672"}, Invalid: []string{"127.0.0.1:15672"}},
		{Key: "delay_publishers", Scope: ScopeNode, DefaultInWords: true, Default: "none: the node's own broker user only", Bounds: "broker user names",
			Doc:   "Broker users besides the node's own whose delayed events (meshctl emit --after --via NODE) its mover delivers when due, as the node's user: each one may have the node publish any event type then. Anything else in the node's due queue is dead-lettered as malformed.",
			Valid: []string{"[ops]"}},
		{Key: "history.stream", Scope: ScopeNode, DefaultInWords: true, Default: "none: the audit logger reads its own queue", Bounds: "a queue name, the same on every node (mesh.history)",
			Doc:   "Keeps the mesh's history on the broker: a stream of this name bound to # on mesh.events, which every node declares. Audit loggers granted history: read it by offset, so any number on any nodes hold the same record and a new one catches up by itself (ADR 35).",
			Valid: []string{"mesh.history"}, Invalid: []string{`"a b"`}},
		{Key: "history.max_age", Scope: ScopeNode, DefaultInWords: true, Default: "0 (kept by age)", Bounds: "0 or 1s or more",
			Doc:   "The stream drops what it has held longer, a segment at a time (x-max-age). Separate from the audit logger's --max-age, which prunes its index. The broker refuses a redeclare with another value: change it on a live stream with a policy.",
			Valid: []string{"720h"}, Invalid: []string{"-1s", "1ms"}},
		{Key: "history.max_bytes", Scope: ScopeNode, DefaultInWords: true, Default: "0 (no bound)", Bounds: "0 or more",
			Doc: "The stream drops its oldest segments past this size on each member (x-max-length-bytes).", Valid: []string{"10000000000"}, Invalid: []string{"-1"}},
		{Key: "history.segment_bytes", Scope: ScopeNode, DefaultInWords: true, Default: "0 (the broker's, 500 MB)", Bounds: "0 or more",
			Doc: "The size of one segment file of the stream (x-stream-max-segment-size-bytes): retention drops whole segments.", Valid: []string{"100000000"}, Invalid: []string{"-1"}},
		{Key: "history.replicas", Scope: ScopeNode, DefaultInWords: true, Default: "0 (every broker node)", Bounds: "0 or more",
			Doc: "How many broker nodes hold the stream when it is first declared (x-initial-cluster-size).", Valid: []string{"3"}, Invalid: []string{"-1"}},
		{Key: "identity.mode", Scope: ScopeNode, Default: runtime.IdentityOff, Bounds: "off, warn or enforce; on, the node's user must be in amqp_url and be the one the rule names for this node",
			Doc: "Holds the x-node of every event the node's modules take from their queues (in-process and module processes alike), and of every tool request they serve, to the broker user that published it: its user-id, which the broker verifies (on the node's own retry copy, the original publisher's), against the user identity.users or identity.user_pattern names for that node (this node's own: its amqp_url's user). " +
				"enforce dead-letters an event that breaks the rule with reason identity and refuses a request as forbidden, naming both users; the handler never runs. warn delivers it, logs a warning (at most 10 per module every 10s) and counts it (mesh_identity_mismatches_total), as enforce would refuse it; off checks nothing, as v0.1.0. " +
				"A node the rule names no user for breaks it, unless the publisher is one of identity.operators. Dead letters, consumed queues and the history's stream are not checked (docs/security.md).",
			Valid: []string{"warn", "enforce"}, Invalid: []string{"strict"}},
		{Key: "identity.users", Scope: ScopeNode, DefaultInWords: true, Default: "none", Bounds: "node name → broker user",
			Doc:   "The broker user each node of the mesh publishes as, by node name: `{berlin: mesh-berlin, paris: mesh-paris}`. Give every node the same rule.",
			Valid: []string{"{berlin: mesh-berlin}"}, Invalid: []string{`{"a b": mesh-x}`, `{berlin: ""}`}},
		{Key: "identity.user_pattern", Scope: ScopeNode, DefaultInWords: true, Default: "none", Bounds: "a user name with {node} in it",
			Doc:   "The broker user of a node identity.users does not name, {node} standing for the node's name: `mesh-{node}`.",
			Valid: []string{`"mesh-{node}"`}, Invalid: []string{"mesh", `"mesh-{user}"`}},
		{Key: "identity.operators", Scope: ScopeNode, DefaultInWords: true, Default: "none", Bounds: "broker user names",
			Doc:   "Broker users that may publish as any node: meshctl's, whose emits and calls carry x-node meshctl-HOST and whose replays carry the original event's x-node as the replaying user. List meshctl's users before turning enforce on, or their emits, calls and replays are refused.",
			Valid: []string{"[ops]"}, Invalid: []string{`[""]`}},

		{Key: "name", Scope: ScopeEntry, Bounds: "one word (as node), no /, not meshctl, unique in the file; required",
			Doc: "The name the module's binary reports. A binary that reports another name is refused.", Valid: []string{"billing"}, Invalid: []string{`"a b"`, `"a/b"`, "meshctl"}},
		{Key: "kind", Scope: ScopeEntry, DefaultInWords: true, Default: "plain (empty)", Bounds: "empty, agent or dispatcher",
			Doc: "What the module is, for operators; a binary that reports another kind is refused.", Valid: []string{"agent", "dispatcher"}, Invalid: []string{"robot"}},
		{Key: "user", Scope: ScopeEntry, DefaultInWords: true, Default: "auto where meshd runs as root, else meshd's own user", Bounds: "auto, root, a user name or UID[:GID]; any but meshd's own needs meshd to run as root",
			Doc:   "Who the module's process runs as. auto gives it a user of its own that meshd picks from 61184-65519 (as systemd's DynamicUser), stable for the node and module; a module runs as root only with user: root. Every module gets a directory of its own, STATE_DIR/modules/NAME (MESH_MODULE_DIR, its HOME), the state dir is closed to it, and Landlock, where the kernel has it, keeps it out of the state dir and the config (docs/security.md).",
			Valid: []string{"auto", "1000:1000"}, Invalid: []string{`"a b"`}},
		{Key: "path", Scope: ScopeEntry, Bounds: "an executable file; required",
			Doc: "The module's binary, run as a module process (relative paths are from meshd's working directory).", Invalid: []string{"/nonexistent/module"}},
		{Key: "args", Scope: ScopeEntry,
			Doc: "Arguments passed to the module's binary."},
		{Key: "required", Scope: ScopeEntry, Default: "false", Bounds: "in a module's entry, not in defaults",
			Doc: "Makes meshd exit when the module does not load or start (at start or on a reload). By default a module that does not start (a binary of a module protocol outside meshd's window, a missing binary, a grant refused, a process that exits) is reported (the log, /readyz, node.NODE.module.failed, mesh_modules_start_failures_total) and tried again with back-off from 1s to 1m, and at once on SIGHUP, while the node and its other modules run."},
		{Key: "group", Scope: ScopeEntry, DefaultInWords: true, Default: "none: the node's own queue", Bounds: "one word (as node); in a module's entry, not in defaults",
			Doc:   "Makes the module's copies on every node whose entry names the same group one group (ADR 48): they share the queue group.GROUP.NAME.events, bound to the module's patterns, and compete for its events, so work spreads as nodes join; without it every node's copy handles every event from its own NODE.NAME.events. A member's own queue stays, bound to nothing: what the node retries waits there for it alone (a node that leaves the group for good leaves its retries there, which meshctl node remove lists). Each event is handled once by the group, at least once where a member stops mid-handling: de-duplication is each node's, so a redelivery to another member runs again unless the handler keeps an inbox on a database the group shares (sdk/outbox). The members must agree on queue_type, max_attempts and max_priority (the broker refuses a differing declare).",
			Valid: []string{"billing"}, Invalid: []string{`"a.b"`, `"two words"`}},
		{Key: "partitions", Scope: ScopeEntry, DefaultInWords: true, Default: "0: no order", Bounds: "0 to 64; above 0 only with group and queue_type quorum",
			Doc:     "Makes the group keep order by key (ADR 48): the events of one key (sdk.WithKey, meshctl emit --key, or the header x-partition-key of a foreign publisher, or its binary-mode CloudEvent's partitionkey; none is the empty key) are handled one at a time, in the order the broker received them, and those of other keys in parallel up to concurrency. They wait in that many queues, group.GROUP.NAME.pNNN, each consumed by one member at a time; a failed event holds its key's later ones until it succeeds or is dead-lettered. 1 is a single consumer of the whole group. Every member must give the same number.",
			Invalid: []string{"-1", "65"}},
		{Key: "order_key", Scope: ScopeEntry, DefaultInWords: true, Default: "none: the emitter's key", Bounds: "source or body.FIELD (names joined by dots); only with partitions",
			Doc:     "The group's rule for an event's key, over any key its emitter gave (ADR 48): source (its x-source) or body.FIELD (a field of its JSON body, a string or a number; body.order.account reaches into objects). Every event then reaches the group through its intake, which keys it by the rule and sends it on (a key's events one at a time, 64 keys at once: slower than keys emitters give); one with no key there is dead-lettered as malformed, naming the rule. Every member must give the same rule.",
			Invalid: []string{"account", "body."}},
		{Key: "config", Scope: ScopeEntry,
			Doc: "The module's own settings, handed to it as JSON (sdk/process.Settings): the dispatcher's triggers, the agent's tools."},
		{Key: "queue_type", Scope: ScopeModule, Default: runtime.QueueQuorum, Bounds: "quorum or classic",
			Doc: "The type of the module's queue (ADR 2). It cannot change for an existing queue: the broker refuses the declare.", Valid: []string{"classic"}, Invalid: []string{"stream"}},
		{Key: "prefetch", Scope: ScopeModule, Default: n(runtime.DefaultPrefetch), Bounds: "1 to 65535; with handler_timeout, below consumer_timeout",
			Doc: "Unacknowledged deliveries the module holds, of events and, separately, of each tool's requests.", Valid: []string{"1", "32"}, Invalid: []string{"-1", "65536"}},
		{Key: "concurrency", Scope: ScopeModule, Default: "1", Bounds: "1 to prefetch",
			Doc: "Handler calls run at once; 1 handles events in queue order.", Valid: []string{"32"}, Invalid: []string{"-1", "33"}},
		{Key: "max_attempts", Scope: ScopeModule, Default: n(runtime.DefaultMaxAttempts), Bounds: "1 to 1000",
			Doc:   "Tries before an event is dead-lettered. It is the quorum queue's delivery limit, so changing it for an existing queue is refused by the broker.",
			Valid: []string{"1", "1000"}, Invalid: []string{"-1", "1001"}},
		{Key: "handler_timeout", Scope: ScopeModule, Default: d(runtime.DefaultHandlerTimeout), Bounds: "above 0; the runs a delivery waits through, plus retry_max, below consumer_timeout",
			Doc: "Bounds one handler call; past it the call is a failed attempt.", Valid: []string{"1s"}, Invalid: []string{"-1s", "2h"}},
		{Key: "retry", Scope: ScopeModule, DefaultInWords: true, Default: "none: retry_min doubling to retry_max", Bounds: "durations from 0s to 2^28-1 s; max_attempts defaults to their count plus one",
			Doc:   "The back-off before each retry of a failed event, in order, the last repeated while attempts remain. One of 10s or more, on a node with delays on, waits in the delay cascade: the failed delivery is acknowledged once its copy is scheduled back, so it is not held against consumer_timeout and may wait hours or days.",
			Valid: []string{"[10s, 1m, 10m, 1h, 6h]"}, Invalid: []string{"[-1s]"}},
		{Key: "max_priority", Scope: ScopeModule, DefaultInWords: true, Default: "0 (none)", Bounds: "0 to 9; above 0 only with queue_type classic",
			Doc: "Declares the queue with x-max-priority so it honours event priorities.", Invalid: []string{"-1", "10"}},
		{Key: "max_delay", Scope: ScopeModule, Default: d(runtime.DefaultMaxDelay), Bounds: "0 to the cascade's longest (about 8.5 years)",
			Doc:   "The longest delay (sdk.After, sdk.At) the module may ask of an emit; a longer one is refused (ErrForbidden). A schedule waits on the broker until it is due, cancelled or not, so this bounds how long what the module schedules holds space there.",
			Valid: []string{"720h"}, Invalid: []string{"-1s"}},
		{Key: "max_scheduled", Scope: ScopeModule, Default: n(runtime.DefaultMaxScheduled), Bounds: "0 or more",
			Doc:   "How many of the module's schedules may wait at once on the node (counted in the node's book, cancelled ones until they come due); an emit past it is refused (ErrForbidden).",
			Valid: []string{"100"}, Invalid: []string{"-1"}},
		{Key: "max_scheduled_bytes", Scope: ScopeModule, Default: n(runtime.DefaultMaxScheduledBytes), Bounds: "0 or more",
			Doc:   "How many bytes of body the module's schedules waiting at once on the node may hold; an emit past it is refused (ErrForbidden).",
			Valid: []string{"1048576"}, Invalid: []string{"-1"}},
		{Key: "emit_grants", Scope: ScopeModule, Bounds: "topic patterns",
			Doc: "Full event types outside the module's own namespace it may emit (\"mesh.delivery.#\", \"node.*.drained\").", Valid: []string{`["mesh.delivery.#"]`}, Invalid: []string{`["a..b"]`}},
		{Key: "tools", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "topic patterns",
			Doc: "The tool keys the module may serve; a module process serves nothing that is not listed.", Valid: []string{`["billing.*"]`}, Invalid: []string{`["a..b"]`}},
		{Key: "calls", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "topic patterns",
			Doc: "The tool keys the module may call; meshd refuses any other call with ErrForbidden before it is sent.", Valid: []string{`["tax.*"]`}, Invalid: []string{`["a..b"]`}},
		{Key: "consumes", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "topic patterns of queue names",
			Doc: "The existing broker queues the module may consume (sdk Consume), matched on the queue name's dot-separated words. The mesh's own queues (mesh.dead-letters, mesh.unrouted, mesh.history, mesh.node.*.due, mesh.delay.*: every name beginning with mesh.) are granted only by their exact name, never by a wildcard: each gives what it holds (every dead letter, every unrouted event, every event of the mesh, a node's due schedules, the schedules waiting at one delay level), and a consumer takes them from the mesh.", Valid: []string{`["shop.orders"]`}, Invalid: []string{`["a..b"]`}},
		{Key: "dead_letters", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "topic patterns of event types",
			Doc: "The event types whose dead letters the module may receive (a DeadLetters handler); its dead-letter queue is bound with exactly these.", Valid: []string{`["#"]`, `["module.billing.#"]`}, Invalid: []string{`["a..b"]`}},
		{Key: "callers", Scope: ScopeModule, DefaultInWords: true, Default: "the module's own (audit.* and dispatcher.*: meshctl only), else anyone", Bounds: "tool pattern → MODULE, NODE/MODULE (* for any) or user:USER",
			Doc:   "Who may call each tool the module serves, checked by the serving node against the caller its node stamped and the user-id the broker verified; \"meshctl\" is the operator.",
			Valid: []string{`{"audit.*": ["meshctl", "berlin/billing"]}`}, Invalid: []string{`{"audit.*": ["a b"]}`}},
		{Key: "allow_duplicates", Scope: ScopeModule, Default: "false",
			Doc: "Turns off de-duplication by event id: every delivery reaches the handler."},
		{Key: "allow_undeclared_emits", Scope: ScopeModule, Default: "false",
			Doc: "Lets the module emit event names its Emits does not declare (refused by default: Emits is what the mesh's graph shows)."},
		{Key: "history", Scope: ScopeModule, Default: "false", Bounds: "in a module's entry, not in defaults",
			Doc: "Grants the module the mesh's history from the stream under history.stream (a History handler: the audit logger with --history); refused without it."},
		{Key: "network.connect", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "HOST:PORT or HOST:LOW-HIGH (HOST may be *); in a module's entry, not in defaults",
			Doc:   "Where the module's process may connect over TCP. Landlock (version 4, Linux 6.7, and later) enforces it by port, on any host: the host says what the grant is for, and meshd resolves and logs it at the module's start. A module granted no network may make no IPv4 or IPv6 socket at all (UDP included); one granted some may not use Multipath TCP or SCTP, which Landlock's TCP rules do not govern. meshd warns of a grant of the broker's or its own ports (docs/security.md).",
			Valid: []string{`["db.internal:5432"]`, `["*:443", "10.0.0.5:8000-8010"]`}, Invalid: []string{`[":5432"]`, `["db:0"]`, `["db:10-5"]`}},
		{Key: "network.bind", Scope: ScopeModule, DefaultInWords: true, Default: "none", Bounds: "[HOST]:PORT or [HOST]:LOW-HIGH; in a module's entry, not in defaults",
			Doc:   "The TCP ports the module's process may listen on (the host is not enforced: Landlock governs ports); :0 for one the kernel picks.",
			Valid: []string{`[":8080"]`, `["127.0.0.1:9000-9009"]`}, Invalid: []string{`["8080"]`, `[":70000"]`}},
		{Key: "skip_body_validation", Scope: ScopeModule, Default: "false",
			Doc: "Does not validate the module's emitted bodies against the schemas it declares (sdk.Module.Schemas); x-schema is still set from them. For emits too many or too large to pay the validation."},

		{Scope: ScopeProcess, Env: "MESH_CONFIG", Flag: "config",
			Doc: "The node's configuration file (mesh.yaml). Without it, the node runs from the environment and flags alone, with no modules."},
		{Scope: ScopeProcess, Env: "MESH_LOG_LEVEL", Flag: "log-level", Default: "info", Bounds: "debug, info, warn or error",
			Doc: "The level of meshd's JSON log on stderr."},
		{Scope: ScopeProcess, Env: "OTEL_EXPORTER_OTLP_ENDPOINT",
			Doc: "Exports traces with OTLP over HTTP to this endpoint (also OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and the exporter's other standard OTEL_ variables). Unset: no span is recorded; trace context is still passed on."},
	}
}

// formatDuration writes d as mesh.yaml would: 30s, 30m, 24h, 200ms.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// WriteReference writes the configuration reference, docs/config.md, in
// Markdown: every setting with its environment variable, flag, default
// and bounds, from Settings.
func WriteReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString(`# Configuration reference

<!-- Generated by ` + "`go run ./cmd/meshd config reference > docs/config.md`" + ` from runtime/nodeconfig/settings.go. Do not edit: a test fails when this file and the code disagree. -->

meshd reads its settings from the configuration file (` + "`--config mesh.yaml`" + `), then from the environment, then from
its flags: each overrides the one before. ` + "`meshd config check --config mesh.yaml`" + ` validates a file without starting
anything, and names every key that breaks a rule. Durations are Go durations (` + "`200ms`, `30s`, `1h`" + `); a key left out,
or set to 0, takes its default. meshctl reads the broker and node name the same way (` + "`MESH_AMQP_URL`, `MESH_AMQP_URLS`, `MESH_NODE`" + `,
or ` + "`--amqp-url`, `--amqp-urls`, `--node`" + `), and, when neither names the broker, the node's environment file
(` + "`/etc/mesh/meshd.env`, `--env-file`; [docs/commands.md](commands.md)" + `).
`)
	section := func(title, intro, scope string) {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", title, intro)
		b.WriteString("| key | environment | flag | default | bounds | what it does |\n|---|---|---|---|---|---|\n")
		for _, s := range Settings() {
			if s.Scope != scope {
				continue
			}
			cell := func(v, wrap string) string {
				if v == "" {
					return ""
				}
				return wrap + strings.ReplaceAll(v, "|", `\|`) + wrap
			}
			flag := s.Flag
			if flag != "" {
				flag = "--" + flag
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(s.Key, "`"), cell(s.Env, "`"), cell(flag, "`"), cell(s.Default, map[bool]string{false: "`"}[s.DefaultInWords]),
				cell(s.Bounds, ""), cell(s.Doc, ""))
		}
	}
	section("The node", "Top-level keys of mesh.yaml.", ScopeNode)
	section("Each module", "Keys of each `modules:` entry, and of `defaults:`, which sets them for every module that does not.", ScopeModule)
	section("Each module entry only", "Keys of each `modules:` entry that `defaults:` cannot set.", ScopeEntry)
	section("meshd alone", "Flags and environment variables with no key in mesh.yaml.", ScopeProcess)
	_, err := io.WriteString(w, b.String())
	return err
}
