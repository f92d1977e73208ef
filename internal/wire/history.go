package wire

// HeaderStreamOffset is where a delivery from the mesh's history (a
// stream, ADR 35) carries its offset: a long, the broker's.
const HeaderStreamOffset = "x-stream-offset"

// HeaderHistoryMarker marks a message a replay from the history puts into
// the stream itself (through the default exchange, with its user-id: the
// broker checks both) to fix its cutoff: what the stream holds before the
// marker is replayed, what comes after never is. Its value is the
// replay's id. A History reader skips it.
const HeaderHistoryMarker = "x-mesh-history-marker"
