package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/runtime"
)

// defaultSchemaMaxAge is how long meshctl emit takes what its last roll
// call learned of the declared schemas as the mesh's (--schema-max-age).
const defaultSchemaMaxAge = time.Minute

// emitSchema is the schema version meshctl emit gives an event of typ
// without --schema: the version the live modules declare as current for
// it, "" if none declares one. The body is checked against that version's
// document as a module's emit is, and a body that does not conform is
// refused.
//
// What the live modules declare is learned by a roll call (their
// heartbeats, and the documents the nodes announce again when the roll
// call asks, else the audit log's) and kept in the user's cache
// (schemaCachePath), per broker and virtual host. Within --schema-max-age
// of that roll call, emit decides from the cache and asks the mesh
// nothing. A body the cached document refuses is never refused on the
// cache's word: emit calls the roll again and decides on its answer,
// which it keeps. A document it cannot get is said on stderr, and the
// event goes as it is.
func emitSchema(c *cli.Context, typ string, body []byte) (string, error) {
	path, pathErr := schemaCachePath(brokerURLs(c))
	if pathErr == nil {
		if cached, err := readSchemaCache(path); err == nil && cached.fresh(time.Now(), c.Duration("schema-max-age")) {
			version, doc, declared := cached.current(typ)
			if !declared {
				return "", nil // no live module declared a schema of it
			}
			if doc != nil {
				if compiled, err := schema.Compile(version, doc); err == nil && compiled.Validate(body) == nil {
					return version, nil
				}
				// Refused, or not compiled: the cache may be stale; the
				// mesh decides.
			}
		}
	}
	learned, err := learnSchemas(c, typ)
	if err != nil {
		return "", err
	}
	if pathErr == nil && learned.heard > 0 { // a roll call no node answered teaches nothing to keep
		if err := writeSchemaCache(path, learned); err != nil {
			fmt.Fprintf(c.App.ErrWriter, "meshctl: the declared schemas are not kept for the next emit (each emit calls the roll): %v\n", err)
		}
	}
	version, doc, declared := learned.current(typ)
	switch {
	case !declared:
		return "", nil // no live module declares a schema of it
	case learned.docErr != nil:
		fmt.Fprintf(c.App.ErrWriter, "meshctl: %s is sent as schema version %s, its body unchecked: %v\n", escape(typ), escape(version), learned.docErr)
		return version, nil
	case doc == nil:
		fmt.Fprintf(c.App.ErrWriter, "meshctl: %s is sent as schema version %s, its body unchecked: no node announced its document, nor does the audit log hold it\n", escape(typ), escape(version))
		return version, nil
	}
	compiled, err := schema.Compile(version, doc)
	if err != nil {
		return "", fmt.Errorf("%s's schema version %s: %w", typ, version, err)
	}
	if err := compiled.Validate(body); err != nil {
		return "", fmt.Errorf("emit %s: %w; fix the body (meshctl schema show %s prints the schema), or give --schema VERSION to send another version", typ, err, typ)
	}
	return version, nil
}

// learnSchemas calls the roll with {"schemas": true} and gathers what the
// live modules declare: every type's versions from the heartbeats, and the
// documents the nodes announced. When the current version of typ has no
// announced document, it reads the audit log's documents too; an error
// doing so is kept in docErr.
func learnSchemas(c *cli.Context, typ string) (*schemaCache, error) {
	taken := time.Now().UTC()
	heard, announced, err := listenMembership(c, true)
	if err != nil {
		return nil, fmt.Errorf("read the declared schemas from the heartbeats (--schema VERSION, or --schema '' for none, skips it): %w", err)
	}
	var beats []runtime.Heartbeat
	for _, h := range heard {
		beats = append(beats, h.Heartbeat)
	}
	sc := &schemaCache{Taken: taken, Types: map[string][]schemaVersion{}, Docs: map[string]json.RawMessage{}, heard: len(heard)}
	for _, st := range schemaTypes(beats) {
		if len(st.Versions) > 0 {
			sc.Types[st.Type] = st.Versions
		}
	}
	live := map[string]bool{} // only the documents of live versions are kept
	for _, vs := range sc.Types {
		for _, v := range vs {
			live[v.Digest] = true
		}
	}
	keep := func(docs map[string][]byte) {
		for digest, doc := range docs {
			if live[digest] {
				sc.Docs[digest] = doc
			}
		}
	}
	keep(announced)
	if v := sc.currentVersion(typ); v != nil && sc.Docs[v.Digest] == nil {
		docs, err := schemaDocsOf(c)
		sc.docErr = err
		keep(docs)
	}
	return sc, nil
}

// schemaCache is what meshctl emit learned of a mesh's declared schemas
// by a roll call, as it keeps it between runs (in JSON).
type schemaCache struct {
	// Taken is when the roll call was called.
	Taken time.Time `json:"taken"`
	// Types are the event types the live modules declare schemas for,
	// each with its versions (the current one marked).
	Types map[string][]schemaVersion `json:"types"`
	// Docs are the documents of those versions, by digest (each checked
	// against its digest when read).
	Docs map[string]json.RawMessage `json:"docs,omitempty"`

	docErr error // why the audit log's documents could not be read
	heard  int   // how many nodes answered the roll call
}

// fresh says sc was learned at most maxAge before now (and not later:
// a clock set back does not make a cache fresh for long).
func (sc *schemaCache) fresh(now time.Time, maxAge time.Duration) bool {
	age := now.Sub(sc.Taken)
	return maxAge > 0 && age >= 0 && age <= maxAge
}

// currentVersion is the version of typ emitted now, or nil.
func (sc *schemaCache) currentVersion(typ string) *schemaVersion {
	st := schemaType{Type: typ, Versions: sc.Types[typ]}
	return st.current()
}

// current is the version of typ emitted now and its document (nil when
// sc lacks it); declared is false when no live module declares a current
// version of typ.
func (sc *schemaCache) current(typ string) (version string, doc json.RawMessage, declared bool) {
	v := sc.currentVersion(typ)
	if v == nil {
		return "", nil, false
	}
	return v.Version, sc.Docs[v.Digest], true
}

// schemaCachePath is the file emit keeps the declared schemas of the mesh
// at urls in: mesh/schemas/<digest>.json in the user's cache directory
// ($XDG_CACHE_HOME, else ~/.cache), one file per broker and virtual host
// (the URLs' schemes, hosts, ports and virtual hosts, not their users or
// passwords).
func schemaCachePath(urls []string) (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	var keys []string
	for _, u := range urls {
		p, err := amqp.ParseURI(u) // the client's reading: its default port and virtual host
		if err != nil {
			return "", errors.New("an unparsable broker URL")
		}
		keys = append(keys, fmt.Sprintf("%s://%s:%d %s", p.Scheme, strings.ToLower(p.Host), p.Port, p.Vhost))
	}
	slices.Sort(keys)
	sum := sha256.Sum256([]byte(strings.Join(slices.Compact(keys), "\n")))
	return filepath.Join(dir, "mesh", "schemas", hex.EncodeToString(sum[:16])+".json"), nil
}

// readSchemaCache reads the cache at path; a document that does not hash
// to its digest is dropped.
func readSchemaCache(path string) (*schemaCache, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var sc schemaCache
	if err := json.Unmarshal(raw, &sc); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	for digest, doc := range sc.Docs {
		if schema.Digest(doc) != digest {
			delete(sc.Docs, digest)
		}
	}
	return &sc, nil
}

// writeSchemaCache replaces the cache at path with sc, readable by the
// user alone (a rename: a reader sees the old file or the new one).
func writeSchemaCache(path string, sc *schemaCache) error {
	raw, err := json.Marshal(sc)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".schemas-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone once renamed
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
