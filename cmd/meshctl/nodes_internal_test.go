package main

import (
	"testing"

	"github.com/meshkit/mesh/runtime"
)

// A module is listed with what sets it apart from its node: another sdk
// release, another protocol, a v0.1.0 binary (which says no release), a
// binary version a v0.1.0 node reports.
func TestModuleLine(t *testing.T) {
	node := runtime.Heartbeat{Release: "v0.2.0", Version: "(devel)", ModuleProtocols: &runtime.ProtocolRange{Min: 7, Max: 8}}
	old := runtime.Heartbeat{Version: "(devel) b02ef4696ef4"}
	for _, tc := range []struct {
		h    runtime.Heartbeat
		m    runtime.ModuleSummary
		want string
	}{
		{node, runtime.ModuleSummary{Name: "a", SDKRelease: "v0.2.0", Protocol: 8}, "a"},
		{node, runtime.ModuleSummary{Name: "a", SDKRelease: "v0.3.0", Protocol: 8, Kind: "agent"}, "a (sdk v0.3.0) (agent)"},
		{node, runtime.ModuleSummary{Name: "a", Protocol: 7, Status: "restarting"}, "a (sdk v0.1.0) [protocol 7] RESTARTING"},
		{node, runtime.ModuleSummary{Name: "a", Version: "v1.2.3"}, "a@v1.2.3"},
		{old, runtime.ModuleSummary{Name: "a", Version: "(devel) b02ef4696ef4"}, "a"},
		{old, runtime.ModuleSummary{Name: "a", Version: "v1.0.0", Status: "waiting"}, "a@v1.0.0 WAITING"},
	} {
		if got := moduleLine(tc.h, tc.m); got != tc.want {
			t.Errorf("moduleLine(%+v) = %q, want %q", tc.m, got, tc.want)
		}
	}
	if got := releaseOf(old); got != "(devel) b02ef4696ef4 (v0.1.0?)" {
		t.Errorf("releaseOf a v0.1.0 node: %q", got)
	}
	if got, want := protocolsOf(node)+" "+protocolsOf(old), "7-8 7"; got != want {
		t.Errorf("protocolsOf: %q, want %q", got, want)
	}
}
