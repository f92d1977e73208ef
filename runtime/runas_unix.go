//go:build unix

package runtime

import (
	"os/exec"
	"strconv"
	"syscall"
)

// runAs makes cmd run as the user c: its uid and gid, no supplementary
// groups, and USER and LOGNAME that say so.
func runAs(cmd *exec.Cmd, c Credential) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	name := c.Name
	if name == "" {
		name = strconv.FormatUint(uint64(c.UID), 10)
	}
	cmd.Env = setEnv(setEnv(cmd.Env, "USER", name), "LOGNAME", name)
}
