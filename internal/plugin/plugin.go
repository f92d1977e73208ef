// Package plugin is the glue both sides of a module process share: the
// go-plugin handshake (with the protocol version) and the gRPC plugin that
// carries the pb.Module service. The sdk serves it in a module process
// (sdk/process.Run); the runtime dials it from meshd.
//
//	client := goplugin.NewClient(&goplugin.ClientConfig{
//		HandshakeConfig:  plugin.Handshake(),
//		Plugins:          plugin.Set(nil),
//		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
//		Cmd:              exec.Command(path),
//	})
package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/meshkit/mesh/internal/plugin/pb"
)

// protocolVersion is the version of the pb protocol. It is a string so a
// test can build a module of another version with -ldflags -X.
var protocolVersion = "7"

// ProtocolVersion is the plugin protocol version this build speaks.
func ProtocolVersion() uint {
	v, err := strconv.ParseUint(protocolVersion, 10, 32)
	if err != nil {
		panic("plugin: bad protocol version " + protocolVersion)
	}
	return uint(v)
}

// Name is the one plugin a module process serves.
const Name = "module"

// Handshake is the go-plugin handshake: a module refuses to run unless
// started by meshd, and meshd refuses a module of another protocol version.
func Handshake() goplugin.HandshakeConfig {
	return goplugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion(),
		MagicCookieKey:   "MESH_MODULE",
		MagicCookieValue: "7f3c1e0a-mesh-module",
	}
}

// Set is the plugin set for go-plugin. server makes the module's service in
// a module process; meshd passes nil.
func Set(server func(*goplugin.GRPCBroker) pb.ModuleServer) goplugin.PluginSet {
	return goplugin.PluginSet{Name: &grpcPlugin{server: server}}
}

// Client is what meshd gets from Dispense: the module's service and the
// broker to offer the host's callback service on.
type Client struct {
	Module pb.ModuleClient
	Broker *goplugin.GRPCBroker
}

type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	server func(*goplugin.GRPCBroker) pb.ModuleServer
}

func (p *grpcPlugin) GRPCServer(b *goplugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterModuleServer(s, p.server(b))
	return nil
}

func (p *grpcPlugin) GRPCClient(_ context.Context, b *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{Module: pb.NewModuleClient(c), Broker: b}, nil
}

// EnvToolGrants is the environment variable meshd sets on a module process
// to the JSON list of the tool patterns it may serve, so that the process
// refuses an ungranted Serve when it is made, as in-process.
const EnvToolGrants = "MESH_MODULE_TOOL_GRANTS"

// EnvMaxMessageBytes is the environment variable meshd sets on a module
// process to the size in bytes of the largest message it accepts from the
// process (an emit batch, an outcome batch, an answer): the process cuts
// its batches to fit.
const EnvMaxMessageBytes = "MESH_MODULE_MAX_MESSAGE_BYTES"

// MaxMessageBytesFromEnv reads EnvMaxMessageBytes; def when it is not set
// or not a positive number.
func MaxMessageBytesFromEnv(def int) int {
	n, err := strconv.Atoi(os.Getenv(EnvMaxMessageBytes))
	if err != nil || n <= 0 {
		return def
	}
	return n
}

// EnvModuleDir is the environment variable meshd sets on a module process
// to the directory of its own, for what it stores (sdk/process.Dir).
const EnvModuleDir = "MESH_MODULE_DIR"

// EnvSettings is the environment variable meshd sets on a module process
// to the module's own settings (its config: in meshd's config), as JSON.
const EnvSettings = "MESH_MODULE_SETTINGS"

// ToolGrantsEnv is the EnvToolGrants entry for grants; nil grants (no
// limit) give no entry.
func ToolGrantsEnv(grants []string) []string {
	if grants == nil {
		return nil
	}
	b, _ := json.Marshal(grants) // a []string always marshals
	return []string{EnvToolGrants + "=" + string(b)}
}

// ToolGrantsFromEnv reads what ToolGrantsEnv set: nil when it is not set.
func ToolGrantsFromEnv() ([]string, error) {
	v, ok := os.LookupEnv(EnvToolGrants)
	if !ok {
		return nil, nil
	}
	grants := []string{}
	if err := json.Unmarshal([]byte(v), &grants); err != nil {
		return nil, fmt.Errorf("%s is not a JSON list of tool patterns: %w", EnvToolGrants, err)
	}
	return grants, nil
}
