//go:build linux

package cgroup

import (
	"os"

	"golang.org/x/sys/unix"
)

// fileSystem is the part of cgroupfs the package uses. The kernel's is osFS; the tests
// put a fake cgroup v2 tree in a temporary directory behind it to check the limits
// written where this machine has no v2 controller.
type fileSystem interface {
	// mkdir creates a cgroup; rmdir removes an empty one.
	mkdir(path string) error
	rmdir(path string) error
	readFile(path string) ([]byte, error)
	// writeFile writes data to an existing interface file in one write(2), as cgroupfs
	// wants; it never creates a file.
	writeFile(path, data string) error
	// subdirs lists the child cgroups of path.
	subdirs(path string) ([]string, error)
	// exists reports whether path exists.
	exists(path string) bool
	// writable reports why this process may not create entries in directory path, or nil.
	writable(path string) error
}

type osFS struct{}

func (osFS) mkdir(p string) error { return os.Mkdir(p, 0o755) }
func (osFS) rmdir(p string) error { return os.Remove(p) }

func (osFS) readFile(p string) ([]byte, error) { return os.ReadFile(p) }

func (osFS) writeFile(p, data string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (osFS) subdirs(p string) ([]string, error) {
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (osFS) writable(p string) error { return unix.Access(p, unix.W_OK|unix.X_OK) }

func (osFS) exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
