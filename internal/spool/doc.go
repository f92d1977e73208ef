// Package spool is a mesh node's local spool: a durable, bounded, ordered
// store of opaque records kept in the node's state dir.
//
// The runtime appends an event here when the broker is unreachable, or when
// a connection dropped before the broker confirmed it; once the broker is
// back it resends the oldest records in order and deletes each one the
// broker confirms.
//
// # Guarantees
//
//   - Durable: Append and Delete return only after the change is fsynced, so
//     it survives the process being killed (SIGKILL included) and a machine
//     crash.
//   - Ordered: every record gets a sequence number (Seq) from a counter kept
//     in the file. A record appended after another Append returned has a
//     higher Seq; Seqs are never reused, not after a Delete nor after the
//     spool is reopened. Oldest returns records in Seq order.
//   - Bounded: the sum of the records' sizes never exceeds Options.MaxBytes.
//     An Append that would exceed it stores nothing and fails with an error
//     wrapping [ErrFull].
//   - Exclusive: one process at a time. A second Open of the same file fails
//     with an error wrapping [ErrLocked] once Options.LockTimeout has passed.
//
// Delivery from the spool is at least once: a record the broker confirmed
// but that was not yet deleted when the node died is sent again.
//
// Concurrent Appends share one write transaction and so one fsync (group
// commit), which is what keeps many emitting goroutines fast.
//
// The store is a single bbolt file (go.etcd.io/bbolt). The bound applies to
// the records' sizes, not to the file: the file adds page overhead and does
// not shrink when records are deleted (bbolt reuses the freed pages).
//
// # Example
//
//	s, err := spool.Open(filepath.Join(stateDir, "spool.db"), spool.Options{})
//	if err != nil {
//		return err // errors.Is(err, spool.ErrLocked): another meshd holds it
//	}
//	defer s.Close()
//
//	// While the broker is away:
//	if _, err := s.Append(body); errors.Is(err, spool.ErrFull) {
//		return wire.ErrBackPressure
//	}
//
//	// Once it is back: resend in order, delete what the broker confirmed.
//	recs, err := s.Oldest(100)
//	if err != nil {
//		return err
//	}
//	var confirmed []uint64
//	for _, r := range recs {
//		if err := publishAndWaitForConfirm(ctx, r.Data); err != nil {
//			break // the rest stays spooled, in order
//		}
//		confirmed = append(confirmed, r.Seq)
//	}
//	return s.Delete(confirmed...) // one fsync for them all
package spool
