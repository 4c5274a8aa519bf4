//go:build linux

package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/toolhost/toolhost/internal/mountinfo"
)

// mount is one cgroup filesystem mount from /proc/self/mountinfo.
type mount struct {
	point string   // where it is mounted
	root  string   // the cgroup it shows at point ("/" unless a subtree is bind-mounted)
	v2    bool     // cgroup2
	ctrls []string // v1: the controllers bound to the hierarchy ("cpu", "cpuacct"); v2: nil
}

// parseMountinfo returns the cgroup and cgroup2 mounts, in mount order.
func parseMountinfo(b []byte) []mount {
	var out []mount
	for _, mi := range mountinfo.Parse(b) {
		m := mount{root: mi.Root, point: mi.Point}
		switch mi.FSType {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			for _, o := range strings.Split(mi.Super, ",") {
				switch {
				case o == "rw", o == "ro", strings.Contains(o, "="), o == "clone_children",
					o == "noprefix", o == "xattr", o == "cpuset_v2_mode", o == "favordynmods":
				default:
					m.ctrls = append(m.ctrls, o)
				}
			}
			if len(m.ctrls) == 0 {
				continue // a named hierarchy such as name=systemd: no controller
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

// selfCgroups is /proc/self/cgroup: the v2 path ("" when absent) and, per v1
// controller, the path of this process in that controller's hierarchy.
type selfCgroups struct {
	v2 string
	v1 map[string]string
}

func parseSelfCgroup(b []byte) selfCgroups {
	s := selfCgroups{v1: map[string]string{}}
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		ctrls, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if id == "0" && ctrls == "" {
			s.v2 = p
			continue
		}
		for _, c := range strings.Split(ctrls, ",") {
			if c != "" && !strings.HasPrefix(c, "name=") {
				s.v1[c] = p
			}
		}
	}
	return s
}

// below returns the directory under mount point m that holds cgroup p, or an error when
// the mount does not show p (a bind mount of another subtree).
func (m mount) below(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("own cgroup unknown")
	case m.root == "/":
		return path.Join(m.point, p), nil
	case p == m.root:
		return m.point, nil
	case strings.HasPrefix(p, m.root+"/"):
		return path.Join(m.point, p[len(m.root):]), nil
	}
	return "", fmt.Errorf("own cgroup %s is outside the part %s mounted at %s", p, m.root, m.point)
}

// owner identifies a process for the lifetime of its pid: the pid and its start time in
// clock ticks since boot (field 22 of /proc/PID/stat), so a recycled pid is not mistaken
// for the process that created a group.
type owner struct {
	pid   int
	start uint64
}

func (o owner) String() string { return strconv.Itoa(o.pid) + "." + strconv.FormatUint(o.start, 10) }

func parseOwner(s string) (owner, bool) {
	p, st, ok := strings.Cut(s, ".")
	if !ok {
		return owner{}, false
	}
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return owner{}, false
	}
	return owner{pid, start}, true
}

// processStart reads the start time of pid; fs.ErrNotExist when there is no such process.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold anything, spaces and ')'
	// included: count fields after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether o still runs: a process with its pid and start time.
func (o owner) alive() bool {
	st, err := processStart(o.pid)
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	// Any other error: assume alive, pruning a live sandbox is worse than leaving a group.
	return err != nil || st == o.start
}
