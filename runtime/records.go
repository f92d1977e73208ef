package runtime

import "github.com/meshkit/mesh/internal/dedup"

// openRecord is one module's record of handled ids, open on the node, and
// how many loads of the module use it: the running one, and a stopped one
// whose handlers, left behind past the grace period, may still finish and
// record what they handled. The record's file is locked while open, so a
// module loaded again while an earlier load's handlers linger shares the
// earlier load's record instead of opening the file a second time.
type openRecord struct {
	set   *dedup.Set
	users int
}

// openRecord returns module's record of handled ids, opening it from path
// unless a load of the module has it open.
func (n *Node) openRecord(module, path string, opts dedup.Options) (*dedup.Set, error) {
	n.recordsMu.Lock()
	defer n.recordsMu.Unlock()
	if r := n.records[module]; r != nil {
		r.users++
		return r.set, nil
	}
	set, err := dedup.Open(path, opts)
	if err != nil {
		return nil, err
	}
	n.records[module] = &openRecord{set: set, users: 1}
	return set, nil
}

// releaseRecord is openRecord's undo: the last user closes the record
// (before a load that comes meanwhile opens it again).
func (n *Node) releaseRecord(module string) error {
	n.recordsMu.Lock()
	defer n.recordsMu.Unlock()
	r := n.records[module]
	if r == nil {
		return nil
	}
	if r.users--; r.users > 0 {
		return nil
	}
	delete(n.records, module)
	return r.set.Close()
}

// releaseRecord releases the module's record of handled ids, once
// whatever path gets there first (a failed load, Stop, Stop's wait for the
// handlers it left behind).
func (m *Module) releaseRecord() error {
	var err error
	m.releaseOnce.Do(func() { err = m.node.releaseRecord(m.def.Name) })
	return err
}
