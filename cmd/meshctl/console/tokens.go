package console

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Token is a token the console accepts. The console keeps no token's
// secret, only its SHA-256: a request's secret is hashed and compared
// with each, in constant time.
type Token struct {
	// Name says whose it is: the log line and the mesh.console.action
	// record of every action taken with it name it.
	Name string
	// SHA256 is the SHA-256 of its secret (HashToken).
	SHA256 [32]byte
	// ReadOnly refuses every action taken with it, as Config.ReadOnly
	// does for all.
	ReadOnly bool
	// Created is when it was made; zero when not known.
	Created time.Time
}

// HashToken is the SHA-256 of a token's secret, as Token.SHA256 holds it.
func HashToken(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// Names the console gives the tokens it did not read from a tokens file:
// they cannot be an operator's (TokenFile.Add refuses them).
const (
	// NameLoginURL is the name of a browser logged in by a one-time
	// login URL (Server.LoginURL).
	NameLoginURL = "login-url"
	// NameToken is Config.Token's name when Config.TokenName is empty.
	NameToken = "token"
)

// ErrNoToken is what TokenFile.Revoke returns for a name the file does
// not hold.
var ErrNoToken = errors.New("no such token")

// tokenNameRE is what a token's name may be: a word of letters, digits
// and ._@- (alice, ci-deploy, bob@ops), at most 64 characters.
var tokenNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// reservedNames are the names of the tokens the console makes or is given
// outside a tokens file (and meshctl's --token-file and printed token).
var reservedNames = []string{NameLoginURL, NameToken, "token-file", "printed-token"}

// ValidTokenName says why name cannot name an operator's token, or nil.
func ValidTokenName(name string) error {
	if !tokenNameRE.MatchString(name) {
		return fmt.Errorf("token name %q: want 1 to 64 letters, digits and ._@- (starting with a letter or digit)", name)
	}
	if slices.Contains(reservedNames, name) {
		return fmt.Errorf("token name %q: reserved for the console's own (%s)", name, strings.Join(reservedNames, ", "))
	}
	return nil
}

// TokenFile is the operators' tokens file (`meshctl console token add`):
// a text file, mode 0600, of one line per token,
//
//	NAME SHA256-HEX read-write|read-only CREATED
//
// (CREATED in RFC 3339), with # comments. It holds no secret: a token is
// printed once when made and only its SHA-256 is kept.
//
// Tokens reads it again whenever it changed (another inode, size, mode
// or modification time: Add and Revoke replace it by a rename), so a console
// that uses it for Config.Tokens sees a token added or revoked from its
// next request, without a restart. A file that cannot be read, is
// malformed, or is writable by anyone but its owner gives none of its
// tokens.
type TokenFile struct {
	path string

	mu     sync.Mutex
	seen   os.FileInfo // the file Tokens last read, or nil
	tokens []Token
	err    error
}

// OpenTokenFile returns the tokens file at path; it need not exist yet
// (it then holds no token).
func OpenTokenFile(path string) *TokenFile { return &TokenFile{path: path} }

// Path is the file's path.
func (f *TokenFile) Path() string { return f.path }

// Tokens are the file's tokens now: read again if the file changed since
// the last call, otherwise as then (a stat). A missing file holds none.
func (f *TokenFile) Tokens() ([]Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if errors.Is(err, os.ErrNotExist) {
		f.seen, f.tokens, f.err = nil, nil, nil
		return nil, nil
	}
	if err != nil {
		f.seen, f.tokens, f.err = nil, nil, fmt.Errorf("tokens file: %w", err)
		return nil, f.err
	}
	if f.seen != nil && os.SameFile(f.seen, fi) && f.seen.ModTime().Equal(fi.ModTime()) && f.seen.Size() == fi.Size() && f.seen.Mode() == fi.Mode() {
		return f.tokens, f.err
	}
	f.seen = fi
	f.tokens, f.err = readTokenFile(f.path, fi)
	if f.err != nil {
		f.tokens = nil
	}
	return f.tokens, f.err
}

// readTokenFile reads and checks the tokens file at path, whose stat is fi.
func readTokenFile(path string, fi os.FileInfo) ([]Token, error) {
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("tokens file %s: writable by others (mode %v), so anyone could add a token: chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	return parseTokens(path, b)
}

// parseTokens reads the lines of a tokens file.
func parseTokens(path string, b []byte) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("tokens file %s: line %d: %s", path, n, fmt.Sprintf(format, args...))
		}
		fields := strings.Fields(line)
		if len(fields) != 4 {
			return nil, bad("want NAME SHA256-HEX read-write|read-only CREATED, got %d fields", len(fields))
		}
		t := Token{Name: fields[0]}
		if err := ValidTokenName(t.Name); err != nil {
			return nil, bad("%v", err)
		}
		h, err := hex.DecodeString(fields[1])
		if err != nil || len(h) != sha256.Size {
			return nil, bad("token %s: its SHA-256 is not 64 hex digits", t.Name)
		}
		copy(t.SHA256[:], h)
		switch fields[2] {
		case "read-write":
		case "read-only":
			t.ReadOnly = true
		default:
			return nil, bad("token %s: access %q: want read-write or read-only", t.Name, fields[2])
		}
		if t.Created, err = time.Parse(time.RFC3339, fields[3]); err != nil {
			return nil, bad("token %s: created %q: want RFC 3339", t.Name, fields[3])
		}
		if slices.ContainsFunc(out, func(o Token) bool { return o.Name == t.Name }) {
			return nil, bad("token %s twice", t.Name)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return out, nil
}

// Add makes a token named name (read-only if asked), keeps its SHA-256
// in the file (made, with its directory, if missing) and returns its
// secret: the only time it is shown. A name the file holds already is
// refused: revoke it first.
func (f *TokenFile) Add(name string, readOnly bool, now time.Time) (string, error) {
	if err := ValidTokenName(name); err != nil {
		return "", err
	}
	secret := randomToken()
	err := f.update(func(ts []Token) ([]Token, error) {
		if slices.ContainsFunc(ts, func(t Token) bool { return t.Name == name }) {
			return nil, fmt.Errorf("token %s exists already in %s: revoke it first (meshctl console token revoke %s)", name, f.path, name)
		}
		return append(ts, Token{Name: name, SHA256: HashToken(secret), ReadOnly: readOnly, Created: now.UTC().Truncate(time.Second)}), nil
	})
	if err != nil {
		return "", err
	}
	return secret, nil
}

// Revoke removes the token named name; ErrNoToken if there is none.
func (f *TokenFile) Revoke(name string) error {
	return f.update(func(ts []Token) ([]Token, error) {
		i := slices.IndexFunc(ts, func(t Token) bool { return t.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%w %q in %s", ErrNoToken, name, f.path)
		}
		return slices.Delete(ts, i, i+1), nil
	})
}

// update reads the file, changes its tokens with change and writes it
// again (a new file renamed over the old, mode 0600), under a lock that
// other meshctl processes updating it take too.
func (f *TokenFile) update(change func([]Token) ([]Token, error)) error {
	dir := filepath.Dir(f.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	unlock, err := lockFile(f.path + ".lock")
	if err != nil {
		return fmt.Errorf("tokens file: lock: %w", err)
	}
	defer unlock()
	var ts []Token
	if fi, err := os.Stat(f.path); err == nil {
		if ts, err = readTokenFile(f.path, fi); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("tokens file: %w", err)
	}
	if ts, err = change(ts); err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString("# meshctl console's tokens: NAME SHA256-HEX ACCESS CREATED. Only the SHA-256 of each token is kept.\n")
	b.WriteString("# Made by meshctl console token add; revoke with meshctl console token revoke NAME.\n")
	for _, t := range ts {
		access := "read-write"
		if t.ReadOnly {
			access = "read-only"
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", t.Name, hex.EncodeToString(t.SHA256[:]), access, t.Created.UTC().Format(time.RFC3339))
	}
	tmp, err := os.CreateTemp(dir, ".console-tokens-*")
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left over after a failure
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("tokens file: %w", err)
	}
	if _, err := tmp.Write(b.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("tokens file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("tokens file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	return nil
}
