// Package stateformat is the format version every file of a node's state
// dir and of a module's directory carries, and the rule a release applies
// when it opens one (docs/compatibility.md, ADR 42):
//
//   - a file of the previous release is read (and upgraded in place where
//     its format moved);
//   - a file of a newer format, written by a later release before a
//     rollback, is refused with ErrNewer and a message naming the file,
//     both formats and what to do, rather than read as something it is
//     not, or changed so that the later release misreads it when the node
//     rolls forward again.
//
// Files of v0.1.0 carry no version (except the dedup log's header): they
// are format 1, the version every file of v0.2.0 writes. Each store keeps
// its version where its kind of file allows: a "meta" bucket of bbolt (the
// spool, the delays book), the dedup log's header byte, the shape of a
// binding record's JSON. The shipped modules' SQLite files (the audit log,
// the dispatcher's firings) keep the same rule in PRAGMA user_version,
// with a few lines of their own: a shipped module imports the sdk only.
//
//	if err := stateformat.Spool.Check(path, found); err != nil {
//		return err // errors.Is(err, stateformat.ErrNewer)
//	}
package stateformat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// ErrNewer is what Check wraps for a file of a format newer than this
// release reads.
var ErrNewer = errors.New("written by a newer release of mesh")

// Format is one kind of state file and the format version this release
// writes.
type Format struct {
	// Name is what the file is, for messages ("spool", "audit log").
	Name string
	// Version is the format this release writes and the newest it reads.
	Version int
}

// The state files and their formats in this release.
var (
	Spool      = Format{Name: "spool", Version: 1}
	DelaysBook = Format{Name: "delays book", Version: 1}
	DedupLog   = Format{Name: "de-duplication log", Version: 1}
	// DedupDigests is the de-duplication log's digest file, beside the
	// log (new in v0.2.0: the log itself kept format 1, so v0.1.0 still
	// reads it after a rollback).
	DedupDigests = Format{Name: "de-duplication digests", Version: 1}
	Bindings     = Format{Name: "binding record", Version: 1}
)

// Unversioned is the version of a file that says none: one of v0.1.0.
const Unversioned = 1

// Check is nil when this release reads a file at path of format found (0:
// the file says none, which is format 1), or an error wrapping ErrNewer.
func (f Format) Check(path string, found int) error {
	if found == 0 {
		found = Unversioned
	}
	if found <= f.Version {
		return nil
	}
	what := strings.TrimSpace(f.Name + " " + path)
	return fmt.Errorf("%s is of format %d, %w; this release reads formats up to %d. Run the release that wrote it (roll forward again), or move the file aside to start it anew (what it holds is then lost to this node)",
		what, found, ErrNewer, f.Version)
}

// metaBucket and formatKey are where a bbolt file keeps its format: a
// bucket of its own, which a release that knows none ignores.
var (
	metaBucket = []byte("meta")
	formatKey  = []byte("format")
)

// CheckBolt checks the format of a bbolt file in an update transaction
// (the "meta" bucket's "format", a big-endian uint32; none, a file of
// v0.1.0, is format 1) and, when it reads it, records f.Version there.
// Call it before the file's own buckets are touched.
func (f Format) CheckBolt(tx *bolt.Tx, path string) error {
	found := 0
	if b := tx.Bucket(metaBucket); b != nil {
		if v := b.Get(formatKey); len(v) == 4 {
			found = int(binary.BigEndian.Uint32(v))
		} else if v != nil {
			return fmt.Errorf("%s %s: its format record is %d bytes, not 4", f.Name, path, len(v))
		}
	}
	if err := f.Check(path, found); err != nil {
		return err
	}
	if found == f.Version {
		return nil
	}
	b, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return fmt.Errorf("%s %s: record its format: %w", f.Name, path, err)
	}
	if err := b.Put(formatKey, binary.BigEndian.AppendUint32(nil, uint32(f.Version))); err != nil {
		return fmt.Errorf("%s %s: record its format: %w", f.Name, path, err)
	}
	return nil
}

// SetBolt records format v in a bbolt file, for tests that make a file of
// another release.
func SetBolt(tx *bolt.Tx, v int) error {
	b, err := tx.CreateBucketIfNotExists(metaBucket)
	if err != nil {
		return err
	}
	return b.Put(formatKey, binary.BigEndian.AppendUint32(nil, uint32(v)))
}
