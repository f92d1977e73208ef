package main

import (
	"fmt"
	"io"

	"github.com/meshkit/mesh/runtime"
)

// writeMetrics writes a node's counters in Prometheus' text exposition
// format, each labelled with the node.
func writeMetrics(w io.Writer, node string, st runtime.Stats) {
	b2i := func(b bool) uint64 {
		if b {
			return 1
		}
		return 0
	}
	metrics := []struct {
		name, kind, help string
		value            any
	}{
		{"mesh_connected", "gauge", "1 while the node has its broker connections.", b2i(st.Connected)},
		{"mesh_publish_blocked", "gauge", "1 while the broker blocks the node's publishing (a memory or disk alarm).", b2i(st.Blocked)},
		{"mesh_publish_blocks_total", "counter", "Times the broker blocked the node's publishing.", st.Blocks},
		{"mesh_disconnects_total", "counter", "Broker sessions lost.", st.Disconnects},
		{"mesh_reconnects_total", "counter", "Broker sessions regained.", st.Reconnects},
		{"mesh_events_emitted_total", "counter", "Events confirmed by the broker when first sent.", st.Emitted},
		{"mesh_events_spooled_total", "counter", "Events written to the local spool.", st.Spooled},
		{"mesh_events_resent_total", "counter", "Spooled events resent and confirmed.", st.Resent},
		{"mesh_events_expired_total", "counter", "Spooled events whose TTL passed before they could be resent.", st.Expired},
		{"mesh_spool_dead_lettered_total", "counter", "Spooled events the broker refused until emit_timeout, moved to the dead letters (reason refused).", st.SpoolDeadLettered},
		{"mesh_spool_unrouted_total", "counter", "Spooled events the broker returned as unroutable, kept in mesh.unrouted.", st.SpoolUnrouted},
		{"mesh_spool_events", "gauge", "Events in the spool now.", st.SpoolEvents},
		{"mesh_spool_bytes", "gauge", "Bytes of events in the spool now.", st.SpoolBytes},
		{"mesh_publish_refused_total", "counter", "Negative confirms from the broker (each was retried).", st.Refused},
		{"mesh_emit_back_pressure_total", "counter", "Emits refused because the spool was full.", st.BackPressure},
		{"mesh_events_handled_total", "counter", "Events whose handler succeeded.", st.Handled},
		{"mesh_handler_failures_total", "counter", "Failed handler attempts.", st.Failed},
		{"mesh_events_dead_lettered_total", "counter", "Events given up on and dead-lettered.", st.DeadLettered},
		{"mesh_duplicates_suppressed_total", "counter", "Deliveries of already handled events acknowledged without handling.", st.Duplicates},
	}
	for _, m := range metrics {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s{node=%q} %v\n", m.name, m.help, m.name, m.kind, m.name, node, m.value)
	}
}
