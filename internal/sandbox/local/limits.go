//go:build linux

package local

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/toolhost/toolhost/internal/cgroup"
)

// Limits bound what one sandbox may use. A zero field means its default; a negative one
// means no limit.
type Limits struct {
	// MemoryBytes bounds the sandbox's memory, the pages of its /tmp and /dev/shm
	// included (they are charged to it). Past it the kernel kills a process of the sandbox,
	// never one of the host. Default 2 GiB. Enforced by a memory cgroup.
	MemoryBytes int64
	// Processes bounds processes and threads together. Default 512. Enforced by a pids
	// cgroup; as root without one, by RLIMIT_NPROC of the sandbox user (shared by every
	// sandbox of the host, since they share that uid).
	Processes int64
	// CPUs is a CPU quota in cores (1.5 = one and a half cores' time). Default: none, all
	// cores. Enforced by the cpu cgroup controller.
	CPUs float64
	// TmpBytes and ShmBytes size the sandbox's private /tmp and /dev/shm. Default 512 MiB
	// each. Enforced by the tmpfs size: writing past it gives ENOSPC.
	TmpBytes int64
	ShmBytes int64
	// DiskBytes bounds the workspace. Default 10 GiB. Enforced for the provider's private
	// workspaces by giving each its own filesystem of that size (ENOSPC past it); a host
	// directory passed as CreateOptions.Workspace is not bounded (only any one file, by
	// RLIMIT_FSIZE).
	DiskBytes int64
	// OpenFiles bounds each process's open descriptors (RLIMIT_NOFILE). Default 16384.
	OpenFiles int64
}

// Defaults of Limits.
const (
	DefaultMemoryBytes = 2 << 30
	DefaultProcesses   = 512
	DefaultTmpBytes    = 512 << 20
	DefaultShmBytes    = 512 << 20
	DefaultDiskBytes   = 10 << 30
	DefaultOpenFiles   = 16384
)

func (l Limits) withDefaults() Limits {
	def := func(v *int64, d int64) {
		switch {
		case *v == 0:
			*v = d
		case *v < 0:
			*v = 0 // no limit
		}
	}
	def(&l.MemoryBytes, DefaultMemoryBytes)
	def(&l.Processes, DefaultProcesses)
	def(&l.TmpBytes, DefaultTmpBytes)
	def(&l.ShmBytes, DefaultShmBytes)
	def(&l.DiskBytes, DefaultDiskBytes)
	def(&l.OpenFiles, DefaultOpenFiles)
	if l.CPUs < 0 {
		l.CPUs = 0
	}
	return l
}

// Enforcement says how one limit is enforced on this host, or that it is not.
type Enforcement struct {
	Resource  string // "memory", "processes", "cpu", "/tmp", "/dev/shm", "disk", "open files", "system calls"
	Limit     string // "2 GiB", "512", "all cores", ...; "none" when unlimited by choice
	Mechanism string // "cgroup v1 memory", "tmpfs size", ...; empty when not enforced
	Missing   string // why it is not enforced, when it should be
}

func (e Enforcement) String() string {
	switch {
	case e.Missing != "":
		return fmt.Sprintf("%s %s: NOT ENFORCED (%s)", e.Resource, e.Limit, e.Missing)
	case e.Mechanism == "":
		return fmt.Sprintf("%s %s", e.Resource, e.Limit)
	}
	return fmt.Sprintf("%s %s (%s)", e.Resource, e.Limit, e.Mechanism)
}

// enforcement works out how each limit is enforced, given what the host offers.
func (p *Provider) enforcement(cg cgroup.Support, volumesErr, seccompErr error) []Enforcement {
	l := p.limits
	var out []Enforcement
	add := func(res, limit, mech, missing string) {
		out = append(out, Enforcement{Resource: res, Limit: limit, Mechanism: mech, Missing: missing})
	}
	switch {
	case l.MemoryBytes == 0:
		add("memory", "none", "", "")
	case cg.Memory.OK():
		add("memory", humanBytes(l.MemoryBytes), cg.Memory.By, "")
	default:
		add("memory", humanBytes(l.MemoryBytes), "", cg.Memory.Why)
	}
	switch {
	case l.Processes == 0:
		add("processes", "none", "", "")
	case cg.Pids.OK():
		add("processes", fmt.Sprint(l.Processes), cg.Pids.By, "")
	case p.id.root:
		add("processes", fmt.Sprint(l.Processes), "RLIMIT_NPROC of the sandbox user, shared by all sandboxes ("+cg.Pids.Why+")", "")
	default:
		add("processes", fmt.Sprint(l.Processes), "", cg.Pids.Why+"; RLIMIT_NPROC would count every process of the host user")
	}
	switch {
	case l.CPUs == 0:
		add("cpu", fmt.Sprintf("all %d cores", runtime.NumCPU()), "", "")
	case cg.CPU.OK():
		add("cpu", fmt.Sprintf("%g cores", l.CPUs), cg.CPU.By, "")
	default:
		add("cpu", fmt.Sprintf("%g cores", l.CPUs), "", cg.CPU.Why)
	}
	add("/tmp", humanBytes(l.TmpBytes), "tmpfs size", "")
	add("/dev/shm", humanBytes(l.ShmBytes), "tmpfs size", "")
	switch {
	case l.DiskBytes == 0:
		add("disk", "none", "", "")
	case volumesErr == nil:
		add("disk", humanBytes(l.DiskBytes), "an ext4 filesystem per private workspace; host directories are not bounded", "")
	default:
		add("disk", humanBytes(l.DiskBytes), "", volumesErr.Error()+"; only one file's size is bounded (RLIMIT_FSIZE)")
	}
	if l.OpenFiles != 0 {
		add("open files", fmt.Sprint(l.OpenFiles), "RLIMIT_NOFILE", "")
	}
	if seccompErr != nil {
		add("system calls", "seccomp filter", "", seccompErr.Error())
	} else {
		add("system calls", "seccomp filter", "bubblewrap --seccomp", "")
	}
	return out
}

// rlimits are the resource limits the agent sets on itself before it serves (see
// agent.go), and so on everything in the sandbox, as "name=value,..." for the agent's
// environment. The host cannot set them from outside: prlimit on a process of another uid
// takes CAP_SYS_RESOURCE, which a container's root often lacks, while lowering one's own
// limits needs nothing.
func (p *Provider) rlimits(cgroupPids bool) string {
	l := p.limits
	r := []string{"core=0"} // no core dumps in the workspace
	if l.OpenFiles > 0 {
		r = append(r, fmt.Sprintf("nofile=%d", l.OpenFiles))
	}
	if l.DiskBytes > 0 {
		r = append(r, fmt.Sprintf("fsize=%d", l.DiskBytes))
	}
	if l.Processes > 0 && !cgroupPids && p.id.root {
		r = append(r, fmt.Sprintf("nproc=%d", l.Processes))
	}
	return strings.Join(r, ",")
}

// limitsLine is the limits in force, for the log line at start.
func limitsLine(es []Enforcement) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return strings.Join(parts, "; ")
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
