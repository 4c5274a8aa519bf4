//go:build linux

package local

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/toolhost/toolhost/core/sandbox"
)

// TestEtcIsSealed: the sandbox's /etc holds copies of a few host files and the synthetic
// ones, none of which the sandbox user can change, replace or remove, none wider than the
// host's, and no host path shows in the sandbox's mount table.
// With the host's network, resolv.conf and hosts join the copies.
func TestEtcIsSealed(t *testing.T) {
	p := newProvider(t, Config{})
	t.Run("isolated", func(t *testing.T) { testEtcIsSealed(t, newSandbox(t, p, sandbox.CreateOptions{})) })
	t.Run("host network", func(t *testing.T) {
		sb := newSandbox(t, p, sandbox.CreateOptions{Network: sandbox.NetworkHost})
		testEtcIsSealed(t, sb)
		for _, f := range etcNetFiles {
			host, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if res := sh(t, sb, "cat "+f); string(res.Stdout) != string(host) {
				t.Errorf("%s in the sandbox is %q, the host's %q", f, res.Stdout, host)
			}
		}
	})
}

func testEtcIsSealed(t *testing.T, sb *Sandbox) {
	res := sh(t, sb, `stat -c '%u %g %a %F %n' /etc /etc/* 2>&1; echo; for f in /etc/*; do [ -f "$f" ] && echo "$f"; done`)
	t.Logf("the sandbox's /etc:\n%s", res.Stdout)
	listing, files, _ := strings.Cut(string(res.Stdout), "\n\n")
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(listing), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			t.Fatalf("stat: %q", line)
		}
		uid, gid, mode, name := f[0], f[1], f[2], f[len(f)-1]
		seen[name] = true
		// What bubblewrap makes in the sandbox's root tmpfs (/etc, the copies) is its
		// host uid's, which the sandbox sees as its own user: the read-only mount, not the
		// owner, is the wall (the chmod, chown and rename probes below).
		_, _ = uid, gid
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil {
			t.Fatalf("mode of %s: %q", name, mode)
		}
		if m&0o022 != 0 {
			t.Errorf("%s is writable by group or others: %o", name, m)
		}
		if fi, err := os.Stat(name); err == nil && name != "/etc" && fi.Mode().IsRegular() && !isSynthetic(name) {
			if host := uint64(fi.Mode().Perm()); m&^host != 0 {
				t.Errorf("%s is %o in the sandbox, wider than the host's %o", name, m, host)
			}
		}
	}
	for _, want := range []string{"/etc/passwd", "/etc/group", "/etc/gitconfig"} {
		if !seen[want] {
			t.Errorf("%s is missing", want)
		}
	}
	if res := sh(t, sb, "cat /etc/passwd /etc/group"); !strings.Contains(string(res.Stdout), "user:x:1000:1000") || !strings.Contains(string(res.Stdout), "user:x:1000:") {
		t.Errorf("passwd and group are not the synthetic ones: %q", res.Stdout)
	}
	for _, f := range strings.Fields(files) {
		for _, op := range []string{
			"echo x >> %[1]q", "chmod 0666 %[1]q", "chown 1000 %[1]q", "mv %[1]q %[1]q.moved", "rm -f %[1]q",
			"ln -f /home/user/.x %[1]q", "touch %[1]q.new", "mv /tmp/x %[1]q",
		} {
			script := "echo y > /tmp/x; echo y > /home/user/.x; " + fmt.Sprintf(op, f)
			if res := sh(t, sb, script+" 2>/dev/null"); res.ExitCode == 0 {
				t.Errorf("the sandbox could %q", fmt.Sprintf(op, f))
			}
		}
	}
	for _, op := range []string{"chmod 0777 /etc", "mkdir /etc/x", "mv /etc /tmp/etc", "rmdir /etc"} {
		if res := sh(t, sb, op+" 2>/dev/null"); res.ExitCode == 0 {
			t.Errorf("the sandbox could %q", op)
		}
	}
	if res := sh(t, sb, "cat /etc/passwd; echo; stat -c %a /etc/passwd"); !strings.Contains(string(res.Stdout), "user:x:1000:1000") {
		t.Errorf("/etc/passwd changed: %q", res.Stdout)
	}
	mi := string(sh(t, sb, "cat /proc/self/mountinfo").Stdout)
	for _, line := range strings.Split(mi, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasPrefix(f[4], "/etc/") {
			continue
		}
		// Only the host's directories of etcFiles stay binds, each at its own path; no file
		// under /etc is a mount (whose source mountinfo would print).
		if f[3] != f[4] {
			t.Errorf("mountinfo shows a host path on /etc: %q", line)
		}
		if res := sh(t, sb, fmt.Sprintf("test -d %q", f[4])); res.ExitCode != 0 {
			t.Errorf("a file of /etc is a mount: %q", line)
		}
	}
}

func isSynthetic(name string) bool {
	return name == "/etc/passwd" || name == "/etc/group" || name == "/etc/gitconfig"
}
