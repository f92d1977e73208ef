// Package pb is the Go code generated from module.proto: the gRPC protocol
// that meshd (the host) and a module process (the plugin) speak through
// hashicorp/go-plugin (docs/adr/0008-plugin-protocol.md).
//
// The module process serves the Module service (Describe, Start, Deliver,
// Answer); meshd serves the Host service (Emit, Call, Hold) to it, one
// long-lived server per module process through the GRPCBroker. sdk/process
// implements ModuleServer and the runtime implements HostServer; package
// github.com/meshkit/mesh/internal/plugin plugs the Module service into
// go-plugin for both.
//
// Edit module.proto, never the .pb.go files, and regenerate with
//
//	make generate
package pb
