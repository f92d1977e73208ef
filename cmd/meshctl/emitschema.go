package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/meshkit/mesh/internal/schema"
	"github.com/meshkit/mesh/runtime"
)

// emitSchema is the schema version meshctl emit gives an event of typ
// without --schema: the version the live modules declare as current for
// it (from their heartbeats, by roll call), "" if none declares one. The
// body is checked against that version's document as a module's emit is,
// and a body that does not conform is refused. The document comes from
// the nodes, which announce their schemas again when the roll call asks,
// or else from the audit log; one it cannot get is said on stderr, and the
// event goes as it is.
func emitSchema(c *cli.Context, typ string, body []byte) (string, error) {
	heard, announced, err := listenMembership(c, true)
	if err != nil {
		return "", fmt.Errorf("read the declared schemas from the heartbeats (--schema VERSION, or --schema '' for none, skips it): %w", err)
	}
	var beats []runtime.Heartbeat
	for _, h := range heard {
		beats = append(beats, h.Heartbeat)
	}
	var v *schemaVersion
	for _, st := range schemaTypes(beats) {
		if st.Type == typ {
			v = st.current()
		}
	}
	if v == nil {
		return "", nil // no live module declares a schema of it
	}
	doc, ok := announced[v.Digest]
	if !ok {
		var docs map[string][]byte
		docs, err = schemaDocsOf(c)
		doc, ok = docs[v.Digest]
	}
	switch {
	case err != nil:
		fmt.Fprintf(c.App.ErrWriter, "meshctl: %s is sent as schema version %s, its body unchecked: %v\n", escape(typ), escape(v.Version), err)
		return v.Version, nil
	case !ok:
		fmt.Fprintf(c.App.ErrWriter, "meshctl: %s is sent as schema version %s, its body unchecked: no node announced its document, nor does the audit log hold it\n", escape(typ), escape(v.Version))
		return v.Version, nil
	}
	compiled, err := schema.Compile(v.Version, doc)
	if err != nil {
		return "", fmt.Errorf("%s's schema version %s: %w", typ, v.Version, err)
	}
	if err := compiled.Validate(body); err != nil {
		return "", fmt.Errorf("emit %s: %w; fix the body (meshctl schema show %s prints the schema), or give --schema VERSION to send another version", typ, err, typ)
	}
	return v.Version, nil
}
