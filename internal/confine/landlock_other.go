//go:build !linux

package confine

// ABI is the version of Landlock the kernel offers: 0 for none.
func ABI() int { return 0 }

// restrictAndExec cannot confine anything here.
func restrictAndExec([]Rule, *User, *Network, string, []string) error { return ErrUnsupported }

// idOf is the file at p: not known here.
func idOf(string) (fileID, bool) { return fileID{}, false }

// FiltersSystemCalls says whether a process granted no network gets no
// IPv4 or IPv6 socket at all: not here.
func FiltersSystemCalls() bool { return false }
