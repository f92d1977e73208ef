package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync/atomic"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/meshkit/mesh/internal/plugin"
	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/sdk"
)

// Describe starts the module binary at path (with args and, if not nil,
// its settings as a node would hand them), asks for its declarations and
// stops it, without attaching it to any mesh: what meshctl schema check
// reads of a module about to be deployed. The sdk.Module it returns holds
// the declarations only (Name, Kind, Emits, Calls, Schemas, Reads), no
// handlers; patterns are the patterns its Setup subscribed.
func Describe(ctx context.Context, path string, args []string, settings []byte, log *slog.Logger) (def sdk.Module, patterns []string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = moduleEnv(os.Environ())
	if settings != nil {
		cmd.Env = append(cmd.Env, plugin.EnvSettings+"="+string(settings))
	}
	var procLog atomic.Pointer[slog.Logger]
	procLog.Store(log)
	const limit = 16 << 20 // a description of many schemas; meshctl, not meshd, reads it
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  plugin.Handshake(),
		VersionedPlugins: plugin.HostPlugins(),
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           pluginLogger(&procLog),
		SkipHostEnv:      true,
		AutoMTLS:         true,
		GRPCDialOptions:  []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit))},
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		return def, nil, fmt.Errorf("start module %s: %w", path, versionError(err))
	}
	raw, err := rpc.Dispense(plugin.Name)
	if err != nil {
		return def, nil, fmt.Errorf("start module %s: %w", path, err)
	}
	desc, err := raw.(*plugin.Client).Module.Describe(ctx, &pb.Empty{})
	if err != nil {
		return def, nil, fmt.Errorf("describe module %s: %w", path, setupError(err))
	}
	schemas, reads, err := declarationsOf(desc)
	if err != nil {
		return def, nil, fmt.Errorf("describe module %s: %w", path, err)
	}
	def = sdk.Module{Name: desc.Name, Kind: desc.Kind, Emits: desc.Emits, Calls: desc.Calls, Schemas: schemas, Reads: reads}
	return def, desc.Patterns, nil
}
