package auditlogger

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/meshkit/mesh/auditlogger/store"
	"github.com/meshkit/mesh/sdk"
)

// Tamper evidence (ADR 35): every row the store keeps is chained (its
// hash covers the previous row's hash and the event's id, type, headers
// and body: store.ChainHash). Someone who can write the database can
// recompute a chain, so the logger also signs the chain's head with a
// key of its own, every CheckpointEvery, and emits the signed checkpoint
// onto the mesh as module.audit-logger.checkpoint: every other logger,
// and anyone on #, then holds a copy the logger cannot take back. Verify
// checks the chain and every checkpoint the store holds.

// CheckpointEvent is the event name of a checkpoint (its type is
// module.audit-logger.checkpoint).
const CheckpointEvent = "checkpoint"

// CheckpointType is a checkpoint's full event type.
const CheckpointType = "module." + Name + "." + CheckpointEvent

// HistoryChain is the Chain of every logger that indexes the mesh's
// history: they all hold the same rows in the same order.
const HistoryChain = "history"

// Checkpoint is a signed statement of a logger's chain head.
type Checkpoint struct {
	// Chain names the chain the head is of: HistoryChain for a logger
	// that reads the history (all such loggers share it), else "own:"
	// and the logger's chain id (its database's).
	Chain string `json:"chain"`
	// HeadID is the id of the newest row, Head its chain hash (hex) and
	// Rows the chained rows then.
	HeadID string `json:"head_id"`
	Head   string `json:"head"`
	Rows   int64  `json:"rows"`
	// Next is the offset of the history the logger read next, for a
	// logger that reads it.
	Next *int64 `json:"next,omitempty"`
	// Time is when it was signed.
	Time time.Time `json:"time"`
	// KeyID names the key (KeyIDOf PublicKey); PublicKey is the key the
	// signature verifies with. It proves the checkpoints of one key
	// consistent; that the key is the logger's is for the auditor to
	// know (meshctl audit verify --key).
	KeyID     string `json:"key_id"`
	PublicKey []byte `json:"public_key"`
	// Signature is ed25519 over the checkpoint's JSON without it.
	Signature []byte `json:"signature,omitempty"`
}

// signed is the bytes the signature covers.
func (c Checkpoint) signed() []byte {
	c.Signature = nil
	b, _ := json.Marshal(c) // a struct of plain fields: cannot fail
	return b
}

// Valid reports whether the checkpoint's signature verifies with its
// public key, and the key id is the key's.
func (c Checkpoint) Valid() bool {
	return len(c.PublicKey) == ed25519.PublicKeySize && KeyIDOf(c.PublicKey) == c.KeyID &&
		ed25519.Verify(ed25519.PublicKey(c.PublicKey), c.signed(), c.Signature)
}

// KeyIDOf names a public key: the first 16 hex digits of its SHA-256.
func KeyIDOf(pub []byte) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// LoadKey reads the logger's signing key from path (PKCS #8 PEM), making
// one (mode 0600) if the file does not exist. To rotate it, move the file
// away and start the logger: checkpoints signed before keep verifying
// with the public key they carry.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("make the audit signing key: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, fmt.Errorf("make the audit signing key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("write the audit signing key %s: %w", path, err)
		}
		werr := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			return nil, fmt.Errorf("write the audit signing key %s: %w", path, err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the audit signing key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("read the audit signing key %s: not a PEM PRIVATE KEY", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("read the audit signing key %s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("read the audit signing key %s: %T is not an ed25519 key", path, k)
	}
	return key, nil
}

// sign makes a checkpoint of head.
func sign(key ed25519.PrivateKey, chain string, head store.Head, next *int64, now time.Time) Checkpoint {
	pub := key.Public().(ed25519.PublicKey)
	c := Checkpoint{Chain: chain, HeadID: head.ID, Head: head.Hash, Rows: head.Rows, Next: next, Time: now.UTC(),
		KeyID: KeyIDOf(pub), PublicKey: pub}
	c.Signature = ed25519.Sign(key, c.signed())
	return c
}

// chain is the name of the chain this logger keeps.
func (l *Logger) chain(ctx context.Context) (string, error) {
	if l.opts.History {
		return HistoryChain, nil
	}
	id, err := l.store.ChainID(ctx)
	if err != nil {
		return "", err
	}
	return "own:" + id, nil
}

// Checkpoint signs the chain's head now and emits it onto the mesh,
// unless the head has not moved since the last one it emitted; it returns
// what it emitted (nil if nothing).
func (l *Logger) Checkpoint(ctx context.Context, m sdk.Mesh) (*Checkpoint, error) {
	if l.key == nil {
		return nil, nil
	}
	head, err := l.store.Head(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	last := l.lastCheckpoint
	l.mu.Unlock()
	if head.Rows == 0 || head.Seq <= last {
		return nil, nil
	}
	// Nothing but checkpoints since the last (its own, or another
	// logger's): a checkpoint of them would only start an endless
	// exchange of checkpoints.
	if moved, err := l.movedSince(ctx, last); err != nil || !moved {
		return nil, err
	}
	chain, err := l.chain(ctx)
	if err != nil {
		return nil, err
	}
	var next *int64
	if l.opts.History {
		if n, ok, err := l.store.HistoryNext(ctx); err != nil {
			return nil, err
		} else if ok {
			next = &n
		}
	}
	c := sign(l.key, chain, head, next, l.now())
	if _, err := m.Emit(ctx, CheckpointEvent, c); err != nil {
		return nil, fmt.Errorf("emit the audit checkpoint: %w", err)
	}
	l.mu.Lock()
	l.lastCheckpoint = head.Seq
	l.mu.Unlock()
	return &c, nil
}

// movedSince reports whether a row other than a checkpoint was stored
// after seq.
func (l *Logger) movedSince(ctx context.Context, seq int64) (bool, error) {
	for after := seq; ; {
		evs, next, err := l.store.Query(ctx, store.Filter{}, store.Page{After: after})
		if err != nil {
			return false, err
		}
		for _, ev := range evs {
			if ev.Type != CheckpointType {
				return true, nil
			}
		}
		if next == 0 {
			return false, nil
		}
		after = next
	}
}

// checkpoints emits a checkpoint every CheckpointEvery until ctx ends.
func (l *Logger) checkpoints(ctx context.Context, m sdk.Mesh) {
	if l.key == nil || l.opts.CheckpointEvery < 0 {
		return
	}
	t := time.NewTicker(l.opts.CheckpointEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := l.Checkpoint(ctx, m); err != nil && ctx.Err() == nil {
			m.Logger().Error("audit checkpoint failed; trying again later", "err", err)
		}
	}
}

// Report is what Verify found: the chain's, and each checkpoint's.
type Report struct {
	// Chain is the name of the chain the store keeps.
	Chain string `json:"chain"`
	// Store is the walk of the chain (store.Verify).
	Store store.Report `json:"store"`
	// Checkpoints is each checkpoint the store holds, checked.
	Checkpoints []CheckpointCheck `json:"checkpoints"`
	// Problem is the first problem, of the chain or of a checkpoint
	// that counts, in words; "" when the record is untouched as far as
	// both can tell.
	Problem string `json:"problem,omitempty"`
	// Pinned are the key ids whose checkpoints count: those asked for,
	// else the logger's own; none when neither is known (then no
	// checkpoint counts, and each is only listed).
	Pinned []string `json:"pinned"`
	// Ignored counts the checkpoints held that do not count: unreadable,
	// badly signed, not published by an audit logger through a verified
	// broker user, or signed by a key not pinned. Anyone allowed the type
	// can publish one, so none of them can fail the verification.
	Ignored int `json:"ignored"`
	// For a store that indexes the history: FirstOffset is the offset of
	// the oldest row it keeps from it, Next the offset it reads next. The
	// stream between them should hold what the rows hold (meshctl audit
	// verify --history compares them).
	FirstOffset *int64 `json:"first_offset,omitempty"`
	Next        *int64 `json:"next,omitempty"`
}

// CheckpointCheck is one checkpoint and what it says of the store.
type CheckpointCheck struct {
	// EventID is the checkpoint event's id.
	EventID string `json:"event_id"`
	Checkpoint
	// Verdict is "ok" (the store's row HeadID has hash Head), "other
	// chain" (of another logger's chain: only its signature is checked),
	// "bad signature", "unreadable", "not a logger's" (not published as
	// the audit logger through a verified broker user), "untrusted key"
	// (signed by a key not in the trusted list), "missing" (the row it
	// names is not in the store: rows were deleted), "pruned" (it names a
	// row older than the store keeps now: retention dropped it) or
	// "differs" (the row it names has another hash: the chain before it
	// was changed).
	Verdict string `json:"verdict"`
	// Counts says whether the checkpoint counts: signed by a pinned key
	// and published by an audit logger. Only one that counts can fail
	// the verification; the others are listed.
	Counts bool `json:"counts"`
}

// Verdicts of a CheckpointCheck.
const (
	VerdictOK           = "ok"
	VerdictOtherChain   = "other chain"
	VerdictBadSignature = "bad signature"
	VerdictUnreadable   = "unreadable"
	VerdictUntrusted    = "untrusted key"
	VerdictNotALoggers  = "not a logger's"
	VerdictMissing      = "missing"
	VerdictPruned       = "pruned"
	VerdictDiffers      = "differs"
)

// Verify checks the logger's record: the chain, row by row, and every
// checkpoint the store holds against it. trusted, if not empty, lists
// the key ids whose checkpoints count (a checkpoint signed by another is
// reported as untrusted); if empty, the logger's own key's count.
func (l *Logger) Verify(ctx context.Context, trusted []string) (Report, error) {
	chain, err := l.chain(ctx)
	if err != nil {
		return Report{}, err
	}
	var own ed25519.PublicKey
	if l.key != nil {
		own = l.key.Public().(ed25519.PublicKey)
	}
	return VerifyStore(ctx, l.store, chain, trusted, own)
}

// VerifyStore is Verify for a store opened on its own (meshctl audit
// verify --db): chain is the chain it keeps (HistoryChain, or "own:" and
// its ChainID); own, if not nil, is the public key of the logger that
// keeps it (PublicKeyOf its key file), whose checkpoints count when
// trusted is empty. With neither, no checkpoint counts.
//
// A checkpoint counts only if it is signed by a pinned key and was
// published as the audit logger (x-source) by a user the broker verified
// (user-id): anyone allowed the type may publish one, and one that does
// not count is listed, never a problem.
func VerifyStore(ctx context.Context, s *store.Store, chain string, trusted []string, own ed25519.PublicKey) (Report, error) {
	rep := Report{Chain: chain, Checkpoints: []CheckpointCheck{}, Pinned: trusted}
	if len(trusted) == 0 && own != nil {
		rep.Pinned = []string{KeyIDOf(own)}
	}
	if rep.Pinned == nil {
		rep.Pinned = []string{}
	}
	var err error
	if rep.Store, err = s.Verify(ctx); err != nil {
		return rep, err
	}
	if p := rep.Store.Problem; p != nil {
		rep.Problem = fmt.Sprintf("row %d (id %s): %s: %s", p.Seq, p.ID, p.Kind, p.Detail)
	}
	if next, ok, err := s.HistoryNext(ctx); err != nil {
		return rep, err
	} else if ok {
		rep.Next = &next
		first, _, err := s.Query(ctx, store.Filter{}, store.Page{})
		if err != nil {
			return rep, err
		}
		for _, ev := range first {
			if ev.Offset != nil {
				rep.FirstOffset = ev.Offset
				break
			}
		}
	}
	stats, err := s.Stats(ctx)
	if err != nil {
		return rep, err
	}
	var cursor int64
	for {
		evs, next, err := s.Query(ctx, store.Filter{Types: []string{CheckpointType}}, store.Page{After: cursor, Limit: 500})
		if err != nil {
			return rep, err
		}
		for _, ev := range evs {
			check := checkpointCheck(ctx, s, chain, trusted, rep.Pinned, stats.OldestArrived, ev)
			if !check.Counts {
				rep.Ignored++
			} else if check.Verdict != VerdictOK && check.Verdict != VerdictOtherChain && check.Verdict != VerdictPruned && rep.Problem == "" {
				rep.Problem = fmt.Sprintf("checkpoint %s (key %s, %s): %s", ev.ID, check.KeyID, check.Time.Format(time.RFC3339), check.Verdict)
			}
			rep.Checkpoints = append(rep.Checkpoints, check)
		}
		if next == 0 {
			return rep, nil
		}
		cursor = next
	}
}

// checkpointCheck checks the checkpoint ev against the store; it counts
// if its key is one of pinned and ev was published as the logger by a
// verified user.
func checkpointCheck(ctx context.Context, s *store.Store, chain string, trusted, pinned []string, oldest time.Time, ev store.Event) CheckpointCheck {
	check := CheckpointCheck{EventID: ev.ID}
	if err := json.Unmarshal(ev.Body, &check.Checkpoint); err != nil {
		check.Verdict = VerdictUnreadable
		return check
	}
	check.Counts = ev.Source == Name && ev.UserID != "" && contains(pinned, check.KeyID)
	switch {
	case !check.Valid():
		check.Verdict, check.Counts = VerdictBadSignature, false
	case ev.Source != Name || ev.UserID == "":
		check.Verdict = VerdictNotALoggers
	case len(trusted) > 0 && !contains(trusted, check.KeyID):
		check.Verdict = VerdictUntrusted
	case check.Chain != chain:
		check.Verdict = VerdictOtherChain
	default:
		hash, err := s.HashOf(ctx, check.HeadID)
		switch {
		case errors.Is(err, store.ErrNotFound) && check.Time.Before(oldest):
			check.Verdict = VerdictPruned // older than what retention keeps
		case errors.Is(err, store.ErrNotFound):
			check.Verdict = VerdictMissing
		case err != nil:
			check.Verdict = VerdictUnreadable
		case hash != check.Head:
			check.Verdict = VerdictDiffers
		default:
			check.Verdict = VerdictOK
		}
	}
	return check
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// PublicKeyOf reads the public half of the signing key at path (as
// LoadKey reads it, without making one).
func PublicKeyOf(path string) (ed25519.PublicKey, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("read the audit signing key: %w", err)
	}
	k, err := LoadKey(path)
	if err != nil {
		return nil, err
	}
	return k.Public().(ed25519.PublicKey), nil
}

// MoveAside renames the database at path, and its -wal and -shm files,
// to path.rebuilt-<time>, so that a logger opened on path starts empty
// and, reading the history, builds it again (audit-logger --rebuild). A
// database that does not exist is not an error.
func MoveAside(path string, now time.Time) error {
	suffix := ".rebuilt-" + now.UTC().Format("20060102T150405Z")
	for _, ext := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(path+ext, path+suffix+ext); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("move the audit database aside: %w", err)
		}
	}
	return nil
}
