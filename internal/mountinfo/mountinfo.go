// Package mountinfo reads the kernel's table of this process's mounts,
// /proc/self/mountinfo (proc_pid_mountinfo(5)).
package mountinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of the table.
type Mount struct {
	ID, Parent int
	Dev        string // the filesystem's major:minor, the same for every mount of it
	Root       string // the directory of the filesystem shown at Point ("/" unless a subtree is bind-mounted)
	Point      string // where it is mounted
	Options    string // the mount's own options (rw,nosuid,...)
	FSType     string
	Source     string
	Super      string // the filesystem's options
}

// Read is this process's table, in mount order (a later mount at the same point lies
// on top of an earlier one).
func Read() ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("the mount table: %w", err)
	}
	return Parse(b), nil
}

// Parse parses a table; lines it cannot read are left out.
func Parse(b []byte) []Mount {
	var out []Mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 6 || len(g) < 3 {
			continue
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Mount{ID: id, Parent: parent, Dev: f[2], Root: unescape(f[3]), Point: unescape(f[4]),
			Options: f[5], FSType: g[0], Source: unescape(g[1]), Super: g[2]})
	}
	return out
}

// unescape undoes the table's octal escapes (\040 for a space and so on).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
