//go:build !linux

package caps

// Current reports ErrUnsupported: only Linux has capabilities.
func Current() (Sets, error) { return Sets{}, ErrUnsupported }

// ClearAmbient reports ErrUnsupported: only Linux has capabilities.
func ClearAmbient() error { return ErrUnsupported }

// DropAllForExec does nothing: only Linux has capabilities.
func DropAllForExec() error { return nil }
