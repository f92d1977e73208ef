package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// metaChainID names the store's own chain in meta.
const metaChainID = "chain_id"

// ChainID names this database's chain: random, made the first time it is
// asked and kept in the database, so the checkpoints of a logger that
// keeps a chain of its own (one that reads a queue, not the history) are
// told apart from another's.
func (s *Store) ChainID(ctx context.Context) (string, error) {
	var id string
	ok, err := getMeta(ctx, s.db, metaChainID, &id)
	if err != nil {
		return "", fmt.Errorf("the audit log's chain id: %w", err)
	}
	if ok {
		return id, nil
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail
	id = hex.EncodeToString(b)
	// Another caller may make one at the same time: the first written wins.
	if _, err := s.db.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO NOTHING`, metaChainID, id); err != nil {
		return "", fmt.Errorf("the audit log's chain id: %w", err)
	}
	if _, err := getMeta(ctx, s.db, metaChainID, &id); err != nil {
		return "", fmt.Errorf("the audit log's chain id: %w", err)
	}
	return id, nil
}
