package outboxstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"time"
)

// ErrNoRelayLock is returned by TryRelayLock for a database with no file
// to lock beside (SQLite in memory): its relays go by the lease alone.
var ErrNoRelayLock = errors.New("outboxstore: this database has no relay lock (SQLite in memory)")

// RelayLock is what a relay holds for as long as it holds the outbox's
// lease, and what the system frees when the relay's process ends: on
// SQLite an exclusive flock on the file DATABASE-outbox-relay beside the
// database (the kernel frees it with the process's last descriptor), on
// PostgreSQL a session-level advisory lock on a connection of its own
// (the server frees it when the session ends, which a process's end
// ends). A relay that takes the lock knows that no live relay holds the
// lease, so it takes the lease at once, whatever the lease row says
// (Seize): a holder that is provably gone is not waited out.
type RelayLock struct {
	file *os.File  // SQLite
	conn *sql.Conn // PostgreSQL
}

// relayLockClass is the first key of the outbox's advisory lock on
// PostgreSQL ("mesh" in ASCII); the second derives from the outbox's
// epoch, so outboxes in other schemas of one database do not share it.
const relayLockClass = 0x6d657368

// relayLockKey is the second key of the outbox's advisory lock.
func (s *Store) relayLockKey() int64 {
	h := fnv.New32a()
	h.Write([]byte("mesh_outbox_relay:" + s.epoch))
	return int64(h.Sum32() & 0x7fffffff)
}

// TryRelayLock takes the outbox's relay lock if no live relay holds it;
// nil and no error if one does. Close it to give it up.
func (s *Store) TryRelayLock(ctx context.Context) (*RelayLock, error) {
	if s.dialect == PostgreSQL {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("outboxstore: relay lock: %w", err)
		}
		var ok bool
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, $2)`, relayLockClass, s.relayLockKey()).Scan(&ok); err != nil {
			discard(conn)
			return nil, fmt.Errorf("outboxstore: relay lock: %w", err)
		}
		if !ok {
			conn.Close() // it holds nothing: back to the pool
			return nil, nil
		}
		return &RelayLock{conn: conn}, nil
	}
	path, err := s.relayLockPath(ctx)
	if err != nil {
		return nil, err
	}
	f, held, err := flock(path)
	if err != nil {
		return nil, fmt.Errorf("outboxstore: relay lock %s: %w", path, err)
	}
	if !held {
		return nil, nil
	}
	return &RelayLock{file: f}, nil
}

// relayLockPath is the file of a SQLite database's relay lock: the
// database's path and "-outbox-relay", as SQLite names its "-wal" and
// "-shm" beside it.
func (s *Store) relayLockPath(ctx context.Context) (string, error) {
	rows, err := s.db.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", fmt.Errorf("outboxstore: relay lock: the database's file: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var name, file string
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", fmt.Errorf("outboxstore: relay lock: the database's file: %w", err)
		}
		if name == "main" {
			if file == "" {
				return "", ErrNoRelayLock
			}
			return file + "-outbox-relay", nil
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("outboxstore: relay lock: the database's file: %w", err)
	}
	return "", ErrNoRelayLock
}

// Close gives the lock up. On PostgreSQL the lock is unlocked first, so
// that it is free when Close returns (the server ends a closed session on
// its own time: a relay that tried at once could find it still held),
// then its connection is closed, not put back in the pool, so no pooled
// session keeps the lock should the unlock have failed.
func (l *RelayLock) Close() error {
	if l == nil {
		return nil
	}
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = l.conn.ExecContext(ctx, `SELECT pg_advisory_unlock_all()`)
		discard(l.conn)
		return nil
	}
	return l.file.Close() // the flock goes with its last descriptor
}

// discard closes conn's session for good.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // database/sql closes a bad connection
	_ = conn.Close()
}

// LeaseRow is the outbox's lease as its row keeps it: which relay holds
// it, and until when (the zero time: released).
type LeaseRow struct {
	Holder string
	Until  time.Time
}

// LeaseHolder reads the lease's row.
func (s *Store) LeaseHolder(ctx context.Context) (LeaseRow, error) {
	var row LeaseRow
	var until int64
	if err := s.db.QueryRowContext(ctx, `SELECT holder, until FROM mesh_outbox_relay WHERE id = 1`).Scan(&row.Holder, &until); err != nil {
		return row, fmt.Errorf("outboxstore: relay lease: %w", err)
	}
	if until > 0 {
		row.Until = time.Unix(0, until)
	}
	return row, nil
}

// Seize makes holder, which holds l, the outbox's relay until now+ttl,
// whoever held the lease, and returns the lease as it was. Every relay
// holds the lock while it holds the lease, so the lease of another
// holder, while l is held, is that of a relay that is gone (or of a
// release before this one, which took no lock). On PostgreSQL it runs on
// l's session: a holder whose session was ended cannot renew.
func (s *Store) Seize(ctx context.Context, l *RelayLock, holder string, now time.Time, ttl time.Duration) (LeaseRow, error) {
	var tx *sql.Tx
	var err error
	if l != nil && l.conn != nil {
		tx, err = l.conn.BeginTx(ctx, nil)
	} else {
		tx, err = s.db.BeginTx(ctx, nil)
	}
	if err != nil {
		return LeaseRow{}, fmt.Errorf("outboxstore: seize the relay lease: %w", err)
	}
	defer tx.Rollback()
	var was LeaseRow
	var until int64
	if err := tx.QueryRowContext(ctx, `SELECT holder, until FROM mesh_outbox_relay WHERE id = 1`).Scan(&was.Holder, &until); err != nil {
		return LeaseRow{}, fmt.Errorf("outboxstore: seize the relay lease: %w", err)
	}
	if until > 0 {
		was.Until = time.Unix(0, until)
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE mesh_outbox_relay SET holder = ?, until = ? WHERE id = 1`), holder, now.Add(ttl).UnixNano()); err != nil {
		return LeaseRow{}, fmt.Errorf("outboxstore: seize the relay lease: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return LeaseRow{}, fmt.Errorf("outboxstore: seize the relay lease: %w", err)
	}
	return was, nil
}

// EndLapsedHolder ends, on PostgreSQL, the session that holds the relay
// lock while the lease row still says lapsed (its holder and its time,
// run out): a holder whose process is gone but whose session the server
// has not yet seen end (its machine lost, say), which would otherwise
// keep every other relay out until TCP gives up. It says whether it
// ended one. On SQLite it does nothing: the kernel frees a flock with its
// process, and a live holder keeps its outbox.
func (s *Store) EndLapsedHolder(ctx context.Context, lapsed LeaseRow) (bool, error) {
	if s.dialect != PostgreSQL {
		return false, nil
	}
	var ended int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 2
		AND EXISTS (SELECT 1 FROM mesh_outbox_relay WHERE id = 1 AND holder = $3 AND until = $4)) t`,
		relayLockClass, s.relayLockKey(), lapsed.Holder, lapsed.Until.UnixNano()).Scan(&ended)
	if err != nil {
		return false, fmt.Errorf("outboxstore: end the lapsed relay's session: %w", err)
	}
	return ended > 0, nil
}
