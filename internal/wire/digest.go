package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Digest is a digest of what an event means: its type, its body and the
// headers that belong to its meaning (x-source, x-schema,
// x-causation-id and the user's x- headers in m.Extra). Two copies of one
// event id with the same digest are the same event (a redelivery, a
// resend, a duplicate); with different digests they are a conflict: the
// same id with other content (ADR 44).
//
// Left out, because a copy of the same event may differ in them: the
// time and node (a publisher's own retry may stamp them again), the
// trace context, the runtime's x-mesh- headers, the broker's (x-death,
// x-delivery-count, x-first-death-*, x-last-death-*, x-received-from)
// and the headers that inform without deciding (x-due, x-replay-id,
// x-deadline). The digest is never 0 (dedup.NoDigest, "unknown").
//
// Digests are kept in state files (the de-duplication digests, a
// module's inbox): the function must never change within a format, or
// every recorded id would turn into a conflict after an upgrade
// (TestDigestStable pins it).
func Digest(eventType string, m Meta, body []byte) uint64 {
	h := sha256.New()
	field := func(s string) {
		h.Write(strconv.AppendInt(nil, int64(len(s)), 10))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	field(eventType)
	field(m.Source)
	field(m.Schema)
	field(m.CausationID)
	keys := make([]string, 0, len(m.Extra))
	for k := range m.Extra {
		if !outsideMeaning(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	field(strconv.Itoa(len(keys)))
	for _, k := range keys {
		field(k)
		field(m.Extra[k])
	}
	h.Write(body)
	var sum [sha256.Size]byte
	d := binary.BigEndian.Uint64(h.Sum(sum[:0]))
	if d == 0 {
		d = 1
	}
	return d
}

// outsideMeaning tells the x- headers Digest leaves out.
func outsideMeaning(k string) bool {
	switch k {
	case "x-death", "x-delivery-count", "x-received-from", HeaderDue, HeaderScheduledBy, HeaderReplayID, HeaderDeadline:
		return true
	}
	return strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") || strings.HasPrefix(k, "x-mesh-")
}

// ConflictError is the error a conflict is dead-lettered with: the
// event id, the digest it was handled with and this copy's.
func ConflictError(id string, handled, digest uint64) string {
	return fmt.Sprintf("event id %s was handled with content digest %s; this copy's digest is %s: the same id with another type, body or headers, not handled",
		id, FormatDigest(handled), FormatDigest(digest))
}

// FormatDigest is how a digest is shown: 16 hex digits.
func FormatDigest(d uint64) string {
	return fmt.Sprintf("%016x", d)
}
