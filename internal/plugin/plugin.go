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
	"errors"
	"fmt"
	"os"
	"strconv"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/meshkit/mesh/internal/plugin/pb"
	"github.com/meshkit/mesh/internal/version"
)

// protocolVersion is the version of the pb protocol this build speaks,
// the newest of its window. It is a string so a test can build a module of
// another version with -ldflags -X.
var protocolVersion = "8"

// oldestProtocol is the oldest module protocol meshd serves: every protocol
// of the previous release stays in the window (docs/compatibility.md). A
// string for -ldflags -X, as protocolVersion.
var oldestProtocol = "7"

// ProtocolOutbox is the first module protocol whose emits may be rows of
// the module's outbox (pb.Emit's outbox fields, sdk/outbox): a host of an
// older one would give each resend of a row a fresh id.
const ProtocolOutbox = 8

// ProtocolKeys is the first module protocol whose emits may carry a key
// (pb.Emit's key, sdk.WithKey; ADR 48): a host of an older one would
// publish the event without it, out of its key's order.
const ProtocolKeys = 8

// ProtocolVersion is the plugin protocol version this build speaks: the
// one a module process built with this sdk offers, and the newest meshd
// serves.
func ProtocolVersion() uint { return parseVersion(protocolVersion) }

// Window is the range of module protocols meshd serves, both ends
// included: a module binary built for any of them runs unchanged, with
// the semantics it was built for.
func Window() Range {
	return Range{Min: min(parseVersion(oldestProtocol), ProtocolVersion()), Max: ProtocolVersion()}
}

// Range is a range of module protocol versions, both ends included.
type Range struct {
	Min uint `json:"min"`
	Max uint `json:"max"`
}

// Has reports whether v is in r.
func (r Range) Has(v uint) bool { return r.Min <= v && v <= r.Max }

// String is "7" for one version, "7-9" for more.
func (r Range) String() string {
	if r.Min == r.Max {
		return strconv.FormatUint(uint64(r.Min), 10)
	}
	return fmt.Sprintf("%d-%d", r.Min, r.Max)
}

// releaseOf names, for each module protocol a release introduced, that
// release: what an operator reads in a refusal. A protocol newer than
// any here was made after this build.
var releaseOf = map[uint]string{
	7: "v0.1.0",
	8: "v0.2.0", // Emit's outbox fields (sdk/outbox)
}

// Release is the first release whose sdk builds module binaries of
// protocol v, or "" for one before v0.1.0 or newer than this build.
func Release(v uint) string { return releaseOf[v] }

func parseVersion(s string) uint {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		panic("plugin: bad protocol version " + s)
	}
	return uint(v)
}

// Name is the one plugin a module process serves.
const Name = "module"

// Handshake is the go-plugin handshake: a module refuses to run unless
// started by meshd, and meshd refuses a module of a protocol outside its
// window (HostPlugins).
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

// HostPlugins is meshd's side of the handshake: one plugin set for each
// protocol of Window, which go-plugin offers the process
// (PLUGIN_PROTOCOL_VERSIONS) and from which it takes the one the process
// answers with; the client's NegotiatedVersion says which. Every version
// dials the same pb.Module service: a protocol differs from the one before
// in what its messages carry and mean, and the host adapts to the
// negotiated version where they differ.
func HostPlugins() map[int]goplugin.PluginSet {
	w := Window()
	out := make(map[int]goplugin.PluginSet, w.Max-w.Min+1)
	for v := w.Min; v <= w.Max; v++ {
		out[int(v)] = Set(nil)
	}
	return out
}

// Refusal is the error for a module binary whose protocol, v, is outside
// the window: it names both, the releases they belong to, and the fix.
func Refusal(v uint) error {
	w := Window()
	served := fmt.Sprintf("module protocols %s (module binaries built with the sdk of %s)", w, releasesOf(w))
	switch {
	case v > w.Max:
		return fmt.Errorf("%w: the binary speaks module protocol %d, newer than this meshd (%s), which serves %s: upgrade meshd to a release that serves protocol %d, or rebuild the module against the sdk of this meshd's release",
			ErrProtocol, v, releaseName(), served, v)
	default:
		built := "an sdk from before v0.1.0"
		if r := Release(v); r != "" {
			built = "the sdk of " + r
		}
		return fmt.Errorf("%w: the binary speaks module protocol %d (%s), which this meshd (%s) no longer serves; it serves %s: rebuild the module against one of those sdk releases",
			ErrProtocol, v, built, releaseName(), served)
	}
}

// ErrProtocol is what Refusal wraps: a module binary of a protocol outside
// meshd's window.
var ErrProtocol = errors.New("module protocol outside this meshd's window")

// releasesOf names the releases of the protocols in w: "v0.1.0 and later".
func releasesOf(w Range) string {
	if r := Release(w.Min); r != "" {
		return r + " and later"
	}
	return "this release"
}

// releaseName is this build's release, for messages.
func releaseName() string { return version.Release() }

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
