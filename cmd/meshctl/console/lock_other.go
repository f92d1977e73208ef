//go:build !unix

package console

// lockFile takes no lock where flock(2) is missing: two meshctl processes
// changing the tokens file at once may lose one's change.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
