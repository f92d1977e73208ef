//go:build unix

package runtime

import (
	"os/exec"
	"strconv"
	"syscall"
)

// runAs gives cmd USER and LOGNAME that say c and, with start, makes it
// run as c: its uid and gid, no supplementary groups.
func runAs(cmd *exec.Cmd, c Credential, start bool) {
	if start {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	}
	name := c.Name
	if name == "" {
		name = strconv.FormatUint(uint64(c.UID), 10)
	}
	cmd.Env = setEnv(setEnv(cmd.Env, "USER", name), "LOGNAME", name)
}
