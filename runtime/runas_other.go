//go:build !unix

package runtime

import "os/exec"

// runAs is not supported here: the process runs as meshd's user.
func runAs(*exec.Cmd, Credential, bool) {}
