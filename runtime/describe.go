package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/wire"
	"github.com/meshkit/mesh/sdk"
)

// Description is what a module binary declares, as its process describes
// itself (DescribeModule), before it joins any mesh.
type Description struct {
	// Def holds the declarations (Name, Kind, Emits, Calls, Schemas,
	// Reads), no handlers.
	Def sdk.Module
	// Patterns are the topic patterns its Setup subscribed; Tools the
	// tools it serves; Consumes the existing queues it consumes.
	Patterns, Tools, Consumes []string
	// DeadLetters and History say it has a DeadLetters or a History
	// handler.
	DeadLetters, History bool
	// Protocol is the module protocol the handshake agreed on, and
	// SDKRelease the sdk release the binary says it was built with ("" for
	// a binary of v0.1.0).
	Protocol   uint
	SDKRelease string
}

// Describe starts the module binary at path (with args and, if not nil,
// its settings as a node would hand them), asks for its declarations and
// stops it, without attaching it to any mesh: what meshctl schema check
// reads of a module about to be deployed. The sdk.Module it returns holds
// the declarations only (Name, Kind, Emits, Calls, Schemas, Reads), no
// handlers; patterns are the patterns its Setup subscribed. As meshd gives
// every module a directory of its own (MESH_MODULE_DIR, where a module
// keeps its database: the audit logger, a --with-db scaffold), the binary
// gets a scratch one, removed when it has described itself.
func Describe(ctx context.Context, path string, args []string, settings []byte, log *slog.Logger) (def sdk.Module, patterns []string, err error) {
	dir, err := os.MkdirTemp("", "mesh-describe-")
	if err != nil {
		return def, nil, fmt.Errorf("a directory for module %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	d, err := DescribeModule(ctx, path, args, ModuleConfig{Settings: settings, Dir: dir}, log)
	return d.Def, d.Patterns, err
}

// DescribeModule is Describe with the whole Description, the binary
// started as the node would start it for mc: its settings, user (RunAs),
// directory, TMPDIR and launcher (the confinement), but no tool grants:
// the description says every tool it serves, for CheckGrants to judge. A
// binary of a module protocol outside the window is refused with
// plugin.ErrProtocol; one that exits as it starts, with its exit status
// and the last lines of its stderr, as meshd run reports it.
func DescribeModule(ctx context.Context, path string, args []string, mc ModuleConfig, log *slog.Logger) (Description, error) {
	var d Description
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cmd := processSpec{path: path, args: args, launcher: mc.Launcher, settings: mc.Settings, dir: mc.Dir, tempDir: mc.TempDir, runAs: mc.RunAs}.command()
	var procLog atomic.Pointer[slog.Logger]
	procLog.Store(log)
	const limit = 16 << 20 // a description of many schemas; a check, not the node, reads it
	tail := &stderrTail{}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		Stderr:           tail, // its last words, if it exits while starting (startError)
		HandshakeConfig:  plugin.Handshake(),
		VersionedPlugins: plugin.HostPlugins(),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           pluginLogger(&procLog),
		SkipHostEnv:      true,
		AutoMTLS:         true,
		GRPCDialOptions:  []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit))},
		UnixSocketConfig: socketConfig(mc.RunAs),
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		return d, fmt.Errorf("start module %s: %w", path, startError(client, cmd, tail, err))
	}
	raw, err := rpc.Dispense(plugin.Name)
	if err != nil {
		return d, fmt.Errorf("start module %s: %w", path, err)
	}
	desc, err := raw.(*plugin.Client).Module.Describe(ctx, &pb.Empty{})
	if err != nil {
		return d, fmt.Errorf("describe module %s: %w", path, setupError(err))
	}
	schemas, reads, err := declarationsOf(desc)
	if err != nil {
		return d, fmt.Errorf("describe module %s: %w", path, err)
	}
	d = Description{
		Def:      sdk.Module{Name: desc.Name, Kind: desc.Kind, Emits: desc.Emits, Calls: desc.Calls, Schemas: schemas, Reads: reads},
		Patterns: desc.Patterns, Tools: desc.Tools, DeadLetters: desc.DeadLetters, History: desc.History,
		Protocol: uint(client.NegotiatedVersion()), SDKRelease: truncateText(desc.SdkRelease, 64),
	}
	for _, c := range desc.Consumes {
		d.Consumes = append(d.Consumes, c.Queue)
	}
	return d, nil
}

// CheckGrants says what d declares that mc does not grant, each with the
// key of the module's entry to add it to: every call (calls:, refused
// when made), every tool it serves (tools:, refused at load), every queue
// it consumes (consumes:), its DeadLetters handler (dead_letters:) and its
// History handler (history: true), all refused at load; and the
// declarations the node refuses whatever the grants (names, kinds,
// emits, calls that are not valid). nil when the node would run it as
// granted. A nil grant list is no limit, as on a node.
func CheckGrants(d Description, mc ModuleConfig) error {
	var errs []error
	def := d.Def
	if err := wire.ValidateModule(def.Name, string(def.Kind), def.Emits, def.Calls); err != nil {
		errs = append(errs, err)
	}
	granted := func(grants []string, key string) bool {
		if grants == nil {
			return true
		}
		for _, g := range grants {
			if wire.MatchPattern(g, key) {
				return true
			}
		}
		return false
	}
	for _, c := range def.Calls {
		if !granted(mc.CallGrants, c) {
			errs = append(errs, fmt.Errorf("%w: the binary calls %s, which its entry does not grant: add %q to calls: (or it is refused at every call)", sdk.ErrForbidden, c, c))
		}
	}
	for _, tool := range d.Tools {
		if !granted(mc.ToolGrants, tool) {
			errs = append(errs, fmt.Errorf("%w: the binary serves %s, which its entry does not grant: add %q to tools:", sdk.ErrForbidden, tool, tool))
		}
	}
	for _, q := range d.Consumes {
		if mc.ConsumeGrants != nil && !slices.ContainsFunc(mc.ConsumeGrants, func(g string) bool { return wire.ConsumeGranted(g, q) }) {
			own := ""
			if strings.HasPrefix(q, wire.MeshQueuePrefix) {
				own = " (the mesh's own queues are granted by their exact name only, never by a wildcard)"
			}
			errs = append(errs, fmt.Errorf("%w: the binary consumes the queue %s, which its entry does not grant%s: add %q to consumes:", sdk.ErrForbidden, q, own, q))
		}
	}
	if d.DeadLetters && mc.DeadLetterGrants != nil && len(mc.DeadLetterGrants) == 0 {
		errs = append(errs, fmt.Errorf("%w: the binary receives dead letters, which its entry does not grant: add the event types' patterns to dead_letters: (\"#\" for all)", sdk.ErrForbidden))
	}
	if d.History && mc.DenyHistory {
		errs = append(errs, fmt.Errorf("%w: the binary reads the mesh's history, which its entry does not grant: set history: true", sdk.ErrForbidden))
	}
	return errors.Join(errs...)
}
