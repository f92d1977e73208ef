// Package dedup keeps, per module, the record of event ids whose handler
// already succeeded, so that the runtime can acknowledge a repeated delivery
// of the same event without running the handler again (idempotent
// consumption, docs/adr/0001-event-wire-contract.md: delivery is at least
// once).
//
// Repeats come from broker redeliveries after a crash, resends from the
// node's spool after a fault and duplicates from a fan-out nack retry. They
// all carry the same x-event-id, a ULID, and a [Set] is keyed by it.
//
// # Use
//
// Open one [Set] per module in the node's state dir. Before running the
// handler ask [Set.Check] with a digest of the event's content; after the
// handler succeeded and before the delivery is acknowledged, call
// [Set.Record] with the same digest:
//
//	set, err := dedup.Open(filepath.Join(stateDir, "dedup", module+".log"), dedup.Options{})
//	if err != nil {
//		return err
//	}
//	defer set.Close()
//
//	verdict, recorded, err := set.Check(eventID, digest)
//	if err != nil {
//		return err // not a ULID: errors.Is(err, dedup.ErrInvalidID)
//	}
//	switch verdict {
//	case dedup.Duplicate:
//		return ack() // handled before: do not run the handler again
//	case dedup.Conflict:
//		return deadLetter(recorded, digest) // the same id with other content
//	}
//	if err := handle(); err != nil {
//		return nack(err)
//	}
//	if err := set.Record(eventID, digest); err != nil {
//		log.Warn("dedup record", "err", err) // at worst a later duplicate runs the handler
//	}
//	return ack()
//
// If the process dies between Record and the acknowledgement, the
// redelivery is acknowledged without running the handler, which is the
// point. If it dies between the handler's success and Record, the handler
// runs again: the record narrows the at-least-once window, it does not close
// it. Seen and Record are two calls, so two concurrent deliveries of the same
// id can both see false; the runtime must not hand one id to two handlers at
// once if it wants at most one run.
//
// # Digests and conflicts
//
// An id is recorded with a digest of what was handled (the caller's: the
// runtime's covers the type, the body and the headers that belong to the
// event's meaning). [Set.Check] tells a duplicate (the same id, the same
// digest) from a conflict (the same id, another digest: a producer's bug
// or a forgery, which must not vanish as a duplicate). An id recorded
// without a digest ([NoDigest]: by v0.1.0, or by a caller that has none)
// is a duplicate of every content, as every repeat was before digests.
//
// # Storage
//
// A Set is an in-memory map from the 16-byte id to the time it was recorded,
// plus an append-only log file: an 8-byte header ("MESHDDP" and a format
// version byte) followed by fixed-size records of 28 bytes, each the 16-byte
// id, the recording time as little-endian unix nanoseconds (8 bytes) and a
// CRC-32C of those 24 bytes (4 bytes, little endian).
//
// [Open] reads the log and keeps the records within the retention window.
// A record whose checksum does not match is skipped and the records after it
// still load: records are fixed-size and written at aligned offsets, so one
// damaged record does not hide the rest, and dropping good records would only
// cause duplicates. Invalid records and a partial record at the end of the
// file (a write torn by a crash) are cut off, so later appends stay aligned.
// A file that does not start with the header is refused with [ErrFormat] and
// left untouched, so that a wrong path never destroys someone else's file.
//
// The digests are in a second file beside the log, "<log>.digests": the
// header "MESHDDG" and its format byte, then records of the same layout
// with the digest in place of the time. They are not in the log so that
// the log keeps the format v0.1.0 reads: a rollback keeps every id and
// loses only the digests. The digest of an id is written before its id,
// so an id in the log has its digest unless it was recorded without one
// (a digest whose id never reached the log is ignored); a compaction
// rewrites both files, the digest file first.
//
// When the log holds more than twice as many records as there are live ids
// (and more than 65536 records), it is compacted: the live records are
// written to a temporary file in the same directory, which is synced and
// renamed over the log, and the directory is synced. This happens at Open,
// and in the background when a Record passes the threshold (in the steady
// state of a full set, once per MaxEntries records): the live entries are
// copied 16,384 at a time under the lock (0.3 ms a chunk), the file is
// written and synced without it (about 100 ms for a million ids on a
// virtual machine's disk), and the files are swapped under the lock with
// the records written meanwhile copied over. Seen and Record go on
// meanwhile; Close waits for a compaction in progress.
//
// # Durability
//
// Record writes its record with one pwrite(2) and no fsync. Once Record has
// returned, the record is in the kernel's page cache and survives the
// process being killed, even by SIGKILL. A power loss or a kernel crash can
// lose the most recent records; the cost is a possible duplicate run of a
// handler, which at-least-once delivery allows anyway. Close syncs the file.
//
// The log is locked (flock) while a Set is open, so a second Open of the same
// file, from this process or another, fails instead of corrupting it.
//
// # Retention and bounds
//
// An id is forgotten [Options.Retention] after it was recorded: Seen treats
// it as absent at once and Record removes it from memory a few at a time. An
// id re-recorded after it expired starts a new retention window. At most
// [Options.MaxEntries] ids are held; beyond that, the ids recorded first are
// forgotten first. Times are wall-clock times, because they outlive the
// process: if the clock steps, ids expire correspondingly earlier or later.
//
// Memory is about 100 bytes per id (the map entry with its time and digest,
// plus the record-order queue), so 100 MB for the default bound of a million
// ids, per module; Go
// maps do not shrink, so that stays allocated once reached. Open reads a
// million ids in about half a second.
//
// # Concurrency
//
// A Set is safe for concurrent use. One mutex guards it; Seen holds it for a
// map lookup (the id is parsed and the clock read outside it), Record for the
// lookup and the write(2).
package dedup
