//go:build linux

package confine

import (
	"fmt"
	goruntime "runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nativeArch is the AUDIT_ARCH_ of the architectures whose system calls
// the filter knows (0 elsewhere).
func nativeArch() uint32 {
	switch goruntime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// The offsets in struct seccomp_data of what the filter reads (the low
// half of an argument: both architectures are little-endian).
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg2 = 32
)

// insn is one instruction of a filter, its jumps by label.
type insn struct {
	label  string // this instruction's, or ""
	f      unix.SockFilter
	jt, jf string // where a conditional jump goes ("" for the next)
}

// assemble resolves the labels of prog into relative jumps.
func assemble(prog []insn) []unix.SockFilter {
	at := map[string]int{}
	for i, in := range prog {
		if in.label != "" {
			at[in.label] = i
		}
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		f := in.f
		if in.jt != "" {
			f.Jt = uint8(at[in.jt] - i - 1)
		}
		if in.jf != "" {
			f.Jf = uint8(at[in.jf] - i - 1)
		}
		out[i] = f
	}
	return out
}

// netFilter is the system-call filter of a process whose network is
// confined. socket() may make a unix or netlink socket; an IPv4 or IPv6
// one only where the process is granted some network (closed false), and
// then only of plain TCP or UDP: Landlock's TCP rules do not govern
// Multipath TCP (IPPROTO_MPTCP, which Go tries first and falls back from)
// nor SCTP, so those would be a way around them. Every other family is
// refused. io_uring_setup (whose requests make sockets past the filter)
// fails with ENOSYS, and any call of another architecture (or x32) with
// EPERM; all else is allowed.
func netFilter(arch uint32, closed bool) []unix.SockFilter {
	const (
		ld  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	errno := func(e unix.Errno) unix.SockFilter {
		return unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(e)}
	}
	prog := []insn{
		{f: unix.SockFilter{Code: ld, K: offArch}},
		{f: unix.SockFilter{Code: jeq, K: arch}, jf: "eperm"},
		{f: unix.SockFilter{Code: ld, K: offNr}},
		{f: unix.SockFilter{Code: jge, K: 0x40000000}, jt: "eperm"}, // x32
		{f: unix.SockFilter{Code: jeq, K: unix.SYS_IO_URING_SETUP}, jt: "enosys"},
		{f: unix.SockFilter{Code: jeq, K: unix.SYS_SOCKET}, jf: "allow"},
		{f: unix.SockFilter{Code: ld, K: offArg0}},
		{f: unix.SockFilter{Code: jeq, K: unix.AF_UNIX}, jt: "allow"},
		{f: unix.SockFilter{Code: jeq, K: unix.AF_NETLINK}, jt: "allow"},
		{f: unix.SockFilter{Code: jeq, K: unix.AF_INET}, jt: "inet"},
		{f: unix.SockFilter{Code: jeq, K: unix.AF_INET6}, jt: "inet", jf: "eafnosupport"},
	}
	if closed {
		prog = append(prog, insn{label: "inet", f: errno(unix.EACCES)})
	} else {
		prog = append(prog,
			insn{label: "inet", f: unix.SockFilter{Code: ld, K: offArg2}},
			insn{f: unix.SockFilter{Code: jeq, K: 0}, jt: "allow"},
			insn{f: unix.SockFilter{Code: jeq, K: unix.IPPROTO_TCP}, jt: "allow"},
			insn{f: unix.SockFilter{Code: jeq, K: unix.IPPROTO_UDP}, jt: "allow", jf: "eprotonosupport"},
		)
	}
	prog = append(prog,
		insn{label: "allow", f: unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW}},
		insn{label: "eperm", f: errno(unix.EPERM)},
		insn{label: "enosys", f: errno(unix.ENOSYS)},
		insn{label: "eafnosupport", f: errno(unix.EAFNOSUPPORT)},
		insn{label: "eprotonosupport", f: errno(unix.EPROTONOSUPPORT)},
	)
	return assemble(prog)
}

// filterNetwork installs netFilter on this thread (which then executes
// the module's binary: the filter passes to it). Where the architecture
// is not known, nothing is installed: Landlock still governs TCP.
func filterNetwork(closed bool) error {
	arch := nativeArch()
	if arch == 0 {
		return nil
	}
	f := netFilter(arch, closed)
	prog := unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("confine: filter the network's system calls: %w", err)
	}
	return nil
}

// FiltersSystemCalls says whether the launcher filters a confined
// process's sockets on this architecture: no IPv4 or IPv6 socket at all
// (UDP included) for a process granted no network, no Multipath TCP or
// SCTP (which Landlock's TCP rules do not govern) for one granted some.
func FiltersSystemCalls() bool { return nativeArch() != 0 }
