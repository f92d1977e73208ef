// Package schedbook is a node's book of what it scheduled through the
// delay cascade and has not delivered yet (ADR 32): the levels of the
// cascade cannot be browsed without taking what waits, and the node that
// scheduled an event is the one whose mover delivers it, so that node
// writes each schedule down, crosses it out on delivery, and answers what
// waits from its book, and marks a cancelled one for its mover to drop.
//
// The book is one bbolt file in the node's state dir, written without
// fsync (db.NoSync): it says what waits and carries cancellations; the
// events themselves wait durably on the broker. A crash of the machine may
// cost the last entries, and a book that does not open is made again
// (Open says so): what it forgot is still delivered, only not listed nor
// cancellable.
//
//	b, err := schedbook.Open(filepath.Join(stateDir, "delays.db"))
//	b.Put(schedbook.Entry{ID: id, Type: "module.shop.reminder", Due: due})
//	entries, total, err := b.List(schedbook.Filter{Type: "module.shop.#"}, 100)
package schedbook

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshkit/mesh/internal/stateformat"

	"github.com/meshkit/mesh/internal/wire"
)

var bucket = []byte("scheduled")

// ErrNotFound is an entry the book does not hold: never scheduled by this
// node, delivered already, or forgotten.
var ErrNotFound = errors.New("not in the node's book of scheduled events")

// Entry is one scheduled event or retry.
type Entry struct {
	ID     string    `json:"id"`
	Type   string    `json:"type"`
	Source string    `json:"source"`
	Due    time.Time `json:"due"`
	// Scheduled is when it was scheduled.
	Scheduled time.Time `json:"scheduled"`
	// Queue is, for a retry, the module queue it goes back to; Attempts
	// the attempts made. Empty for a delayed event.
	Queue    string `json:"queue,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	// Cancelled says its delivery is to be dropped.
	Cancelled bool `json:"cancelled,omitempty"`
	// Bytes is its body's size, counted against its source's bound
	// (0 in an entry of v0.1.0's book).
	Bytes int `json:"bytes,omitempty"`
}

// Key is the entry's key in the book: its id, or for a retry its queue
// and id (an event may wait as a delayed event and as a retry at once).
func (e Entry) Key() string { return Key(e.ID, e.Queue) }

// Key is the key of the entry of event id (queue "" for a delayed event,
// else the retry's queue).
func Key(id, queue string) string {
	if queue == "" {
		return id
	}
	return queue + "/" + id
}

// Book is a node's book of schedules; safe for concurrent use.
type Book struct {
	db *bolt.DB
}

// Open opens the book at path, making it if needed; a file that does not
// open as a book is moved aside (path.broken) and a new one made, and
// remade reports so.
func Open(path string) (b *Book, remade bool, err error) {
	db, err := open(path)
	if errors.Is(err, stateformat.ErrNewer) {
		return nil, false, err // a later release's book: kept for it, not remade
	}
	if err != nil {
		if rerr := os.Rename(path, path+".broken"); rerr != nil {
			return nil, false, fmt.Errorf("schedbook: %w (and it cannot be moved aside: %w)", err, rerr)
		}
		remade = true
		if db, err = open(path); err != nil {
			return nil, remade, err
		}
	}
	return &Book{db: db}, remade, nil
}

func open(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, NoSync: true})
	if err != nil {
		return nil, fmt.Errorf("schedbook: open %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := stateformat.DelaysBook.CheckBolt(tx, path); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("schedbook: %s: %w", path, err)
	}
	return db, nil
}

// Close closes the book.
func (b *Book) Close() error { return b.db.Close() }

// Put writes e down (again: a repeated schedule of the same id replaces
// the entry). Concurrent Puts share a transaction.
func (b *Book) Put(e Entry) error {
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("schedbook: %w", err)
	}
	return b.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(e.Key()), data) })
}

// Get is the entry under key.
func (b *Book) Get(key string) (Entry, error) {
	var e Entry
	err := b.db.View(func(tx *bolt.Tx) error {
		data := tx.Bucket(bucket).Get([]byte(key))
		if data == nil {
			return ErrNotFound
		}
		return json.Unmarshal(data, &e)
	})
	return e, err
}

// Delete crosses out the entry under key (delivered or dropped); one not
// there is no error.
func (b *Book) Delete(key string) error {
	return b.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(key)) })
}

// Cancel marks the delayed event id cancelled, so the mover drops it when
// it comes due, and returns its entry; ErrNotFound if the book does not
// hold it (delivered already, or never scheduled here).
func (b *Book) Cancel(id string) (Entry, error) {
	var e Entry
	err := b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		data := bk.Get([]byte(id))
		if data == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(data, &e); err != nil {
			return err
		}
		e.Cancelled = true
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		return bk.Put([]byte(id), data)
	})
	return e, err
}

// Len is how many entries the book holds (it walks the book's pages:
// for metrics, not for every emit).
func (b *Book) Len() int {
	n := 0
	_ = b.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucket).Stats().KeyN
		return nil
	})
	return n
}

// Filter selects entries: Type an AMQP topic pattern of their type ("" or
// "#": any), Source their source ("": any).
type Filter struct {
	Type, Source string
}

func (f Filter) match(e Entry) bool {
	return (f.Type == "" || wire.MatchPattern(f.Type, e.Type)) && (f.Source == "" || f.Source == e.Source)
}

// List returns up to limit entries f selects, soonest due first, and how
// many it selects in all.
func (b *Book) List(f Filter, limit int) ([]Entry, int, error) {
	var out []Entry
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, data []byte) error {
			var e Entry
			if err := json.Unmarshal(data, &e); err != nil {
				return nil // unreadable: skipped, delivered all the same
			}
			if f.match(e) {
				out = append(out, e)
			}
			return nil
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("schedbook: %w", err)
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.Due.Compare(b.Due) })
	total := len(out)
	if limit >= 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, total, nil
}
