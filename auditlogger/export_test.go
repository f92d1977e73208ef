package auditlogger

import (
	"crypto/ed25519"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
)

// SignForTest signs a checkpoint of a made-up head with a fixed key: the
// same bytes in every process (a fuzz test's workers make their own).
func SignForTest() Checkpoint {
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	return sign(key, HistoryChain, store.Head{Seq: 7, ID: "01JAUDIT0000000000000000007", Hash: "ab", Rows: 7}, nil, time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC))
}
