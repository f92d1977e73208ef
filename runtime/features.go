package runtime

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Features: a behaviour of the mesh that needs what not every node has
// turns on only where it is safe, as RabbitMQ's feature flags do
// (docs/adr/0040-features-and-permissions.md).
//
//   - Needs a broker permission: a node whose user lacks it logs one
//     warning naming the permission and how to grant it, and runs without
//     the feature, instead of exiting (delays: the delay cascade).
//   - Needs every node to understand it (a new header that changes
//     meaning): on only when every live node's heartbeat lists it among
//     its Features (Node.MeshHas); meshctl features lists who lacks each.

// Feature names a behaviour a node may have or lack.
type Feature string

// The features of this release. A node of v0.1.0 sends no list in its
// heartbeat: it is taken to have the v0.1.0 ones (v010Features).
const (
	// FeatureDelays is the delay cascade (ADR 32): delayed emits, and
	// retries that wait without holding their delivery. It needs the
	// permissions on mesh.delay.* and the node's due queue.
	FeatureDelays Feature = "delays"
	// FeatureHistory is the history stream (ADR 35).
	FeatureHistory Feature = "history"
	// FeatureModuleProtocolWindow is meshd serving every module protocol
	// of the previous release (ADR 39).
	FeatureModuleProtocolWindow Feature = "module-protocol-window"
)

// KnownFeatures are the features this release knows, in order.
var KnownFeatures = []Feature{FeatureDelays, FeatureHistory, FeatureModuleProtocolWindow}

// v010Features are the features a node of v0.1.0 has (it sends no list).
var v010Features = []Feature{FeatureDelays, FeatureHistory}

// delaysOn says whether the node runs the delay cascade: its config asks
// for it and the broker did not refuse it.
func (n *Node) delaysOn() bool { return n.cfg.Delays && n.featureOff(FeatureDelays) == nil }

// delaysOffReason says why the node's delays are off.
func (n *Node) delaysOffReason() error {
	if err := n.featureOff(FeatureDelays); err != nil {
		return err
	}
	return errors.New("its config says delays: false")
}

// scheduled reports whether a retry back-off of d goes through the delay
// cascade rather than being held (Config.scheduled, on a node whose
// delays are on).
func (n *Node) scheduled(d time.Duration) bool { return n.delaysOn() && n.cfg.scheduled(d) }

// featureOff is why the broker refused the node feature f, or nil.
func (n *Node) featureOff(f Feature) error {
	if err, ok := n.refused.Load(f); ok {
		return err.(error)
	}
	return nil
}

// featureRefused turns feature f off for the node's life, the broker having
// refused it (err, an ACCESS_REFUSED): one warning names the permission
// and the fix.
func (n *Node) featureRefused(f Feature, err error) {
	why := fmt.Errorf("the broker user %s lacks a permission it needs (%v); print the node's permissions with `meshctl topology permissions --config mesh.yaml`, apply the rabbitmqctl set_permissions line it prints, and restart meshd", n.userID, err)
	if _, loaded := n.refused.LoadOrStore(f, why); loaded {
		return
	}
	what := map[Feature]string{FeatureDelays: "delayed emits are refused and long retries are held instead of waiting in the delay cascade"}[f]
	n.log.Warn("a feature is off: the broker refused its permissions; the node runs without it", "feature", string(f), "consequence", what, "err", why)
}

// Features are the features the node has now: those of its release it has
// on and the broker did not refuse.
func (n *Node) Features() []Feature {
	var out []Feature
	for _, f := range KnownFeatures {
		switch f {
		case FeatureDelays:
			if !n.delaysOn() {
				continue
			}
		case FeatureHistory:
			if n.cfg.History.Stream == "" {
				continue
			}
		}
		out = append(out, f)
	}
	return out
}

// MeshHas says whether every live node of the mesh has feature f: this
// one, and every peer whose heartbeats have not stopped (a node of
// v0.1.0 has v010Features). A behaviour that every node must understand
// turns on only when it holds.
func (n *Node) MeshHas(f Feature) bool {
	if !slices.Contains(n.Features(), f) {
		return false
	}
	for _, p := range n.Peers() {
		if !p.Unreachable && !slices.Contains(p.features(), f) {
			return false
		}
	}
	return true
}

// features are the features a heartbeat says its node has.
func (h Heartbeat) features() []Feature {
	if h.Release == "" {
		return v010Features
	}
	out := make([]Feature, 0, len(h.Features))
	for _, f := range h.Features {
		out = append(out, Feature(f))
	}
	return out
}

// FeatureState is one feature across the mesh, as meshctl features shows
// it: the live nodes that have it and those that lack it.
type FeatureState struct {
	Feature Feature  `json:"feature"`
	Has     []string `json:"has"`
	Lacks   []string `json:"lacks"`
}

// MeshFeatures is each feature known to this release or named by a
// heartbeat, across the nodes heard (their last heartbeats).
func MeshFeatures(heard []Heartbeat) []FeatureState {
	known := slices.Clone(KnownFeatures)
	for _, h := range heard {
		for _, f := range h.features() {
			if !slices.Contains(known, f) {
				known = append(known, f)
			}
		}
	}
	out := make([]FeatureState, 0, len(known))
	for _, f := range known {
		st := FeatureState{Feature: f, Has: []string{}, Lacks: []string{}}
		for _, h := range heard {
			if slices.Contains(h.features(), f) {
				st.Has = append(st.Has, h.Node)
			} else {
				st.Lacks = append(st.Lacks, h.Node)
			}
		}
		slices.Sort(st.Has)
		slices.Sort(st.Lacks)
		out = append(out, st)
	}
	slices.SortStableFunc(out, func(a, b FeatureState) int { return strings.Compare(string(a.Feature), string(b.Feature)) })
	return out
}
