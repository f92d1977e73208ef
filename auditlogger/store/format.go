package store

import (
	"database/sql"
	"errors"
	"fmt"
)

// FormatVersion is the format of the audit database this release writes
// and the newest it reads, kept in SQLite's PRAGMA user_version. A
// database of v0.1.0 says 0: it is format 1, this one. A later release
// that changes the schema moves it, and keeps reading this one
// (docs/compatibility.md; meshd's state files follow the same rule,
// internal/stateformat, which a shipped module does not import).
const FormatVersion = 1

// ErrNewerFormat is what Open wraps for a database of a format newer than
// FormatVersion: one a later release wrote, before a rollback.
var ErrNewerFormat = errors.New("written by a newer release of mesh")

// checkFormat refuses a database of a newer format before anything in it
// changes (an older logger writing into a newer schema would leave rows the
// later release reads as tampering), and records FormatVersion in one of
// an older or no format.
func checkFormat(tx *sql.Tx) error {
	var found int
	if err := tx.QueryRow("PRAGMA user_version").Scan(&found); err != nil {
		return fmt.Errorf("read the format (user_version): %w", err)
	}
	if found > FormatVersion {
		return fmt.Errorf("the audit log is of format %d, %w; this release reads formats up to %d. Run the audit logger of the release that wrote it (roll forward again), or open a copy of it with that release's meshctl audit verify --db", found, ErrNewerFormat, FormatVersion)
	}
	if found == FormatVersion {
		return nil
	}
	if _, err := tx.Exec(fmt.Sprintf("PRAGMA user_version = %d", FormatVersion)); err != nil {
		return fmt.Errorf("record the format (user_version): %w", err)
	}
	return nil
}
