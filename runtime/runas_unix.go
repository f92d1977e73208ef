//go:build unix

package runtime

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// runAs gives cmd USER and LOGNAME that say c and, with start, makes it
// run as c: its uid and gid, no supplementary groups. Without start, cmd
// is a launcher that takes c on itself; a meshd that is not root starts
// it with the capabilities to (launcherCaps).
func runAs(cmd *exec.Cmd, c Credential, start bool) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if start {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: []uint32{}}
	} else if os.Geteuid() != 0 {
		launcherCaps(cmd.SysProcAttr)
	}
	name := c.Name
	if name == "" {
		name = strconv.FormatUint(uint64(c.UID), 10)
	}
	cmd.Env = setEnv(setEnv(cmd.Env, "USER", name), "LOGNAME", name)
}
