//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultHostID is the host uid and gid of the sandbox user when the host runs as root:
// unprivileged, and outside the ranges that distributions hand out (regular users below
// 60000, subordinate ids for rootless containers from 100000 up to 600100000, systemd's
// container range up to 1879048191).
const DefaultHostID = 2100000000

// identity is who the sandbox user (uid and gid 1000 inside) is on the host.
//
// bubblewrap maps the sandbox user to the uid that runs bwrap. When that is root, every file
// a sandbox writes into a workspace belongs to root on the host, a chmod u+s leaves a
// setuid-root program there, and per-user limits count every root process of the machine.
// So a root host starts bwrap as an unprivileged uid of its own (identity.uid, nothing else
// uses it) with no supplementary groups: the sandbox user is that uid on the host, host root
// is not mapped inside at all (its files show as "nobody"), and the workspace root belongs
// to root with the sandbox user's group, so the sandbox can fill it but not chmod or chown
// it. A host that is not root has no other uid to give: the sandbox user is the host user.
type identity struct {
	root     bool // the host runs as root
	uid, gid int  // host ids of the sandbox user
}

func newIdentity(uid, gid int) (identity, error) {
	if os.Geteuid() != 0 {
		return identity{uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	if uid <= 0 || gid <= 0 {
		return identity{}, fmt.Errorf("the sandbox user's host uid and gid must be unprivileged (not 0), got %d:%d", uid, gid)
	}
	return identity{root: true, uid: uid, gid: gid}, nil
}

// credential is what bwrap runs as: the sandbox user's host ids when the host is root.
func (id identity) credential() *syscall.Credential {
	if !id.root {
		return nil
	}
	return &syscall.Credential{Uid: uint32(id.uid), Gid: uint32(id.gid), Groups: []uint32{}}
}

// ownRoot gives a workspace root (or the run dir) made by the provider its owner and mode:
// as root, root:gid 0770, which the sandbox user can fill but not chmod; otherwise 0700.
func (id identity) ownRoot(dir string) error {
	if !id.root {
		return os.Chmod(dir, 0o700)
	}
	if err := os.Lchown(dir, 0, id.gid); err != nil {
		return err
	}
	return os.Chmod(dir, 0o770)
}

// adopt hands a caller's directory to the sandbox user, as root: every entry below it that
// root owns becomes the sandbox user's (so the sandbox can edit the files the caller put
// there), entries of other users are left as they are, and the directory itself stays
// root's, gains the sandbox user's group and group rwx. The walk goes through directory
// descriptors and never follows a symbolic link (a sandbox may have planted one in an
// earlier run), and links themselves are chowned without being followed.
func (id identity) adopt(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errors.New("not a directory")
	}
	owner := int(st.Uid)
	if owner == id.uid {
		owner = 0 // never let the sandbox user own the root it could then chmod
	}
	if err := unix.Fchown(int(d.Fd()), owner, id.gid); err != nil {
		return err
	}
	if err := unix.Fchmod(int(d.Fd()), (st.Mode&0o7777&^0o6000)|0o070); err != nil {
		return err
	}
	return id.adoptBelow(d, 0)
}

// maxAdoptDepth bounds the walk (each level holds a descriptor open).
const maxAdoptDepth = 512

func (id identity) adoptBelow(d *os.File, depth int) error {
	if depth > maxAdoptDepth {
		return fmt.Errorf("directories nested deeper than %d levels", maxAdoptDepth)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	dfd := int(d.Fd())
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // vanished
		}
		if st.Uid == 0 {
			if err := unix.Fchownat(dfd, name, id.uid, id.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("chown %s: %w", name, err)
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // vanished or replaced by a link
		}
		sub := os.NewFile(uintptr(fd), name)
		err = id.adoptBelow(sub, depth+1)
		sub.Close()
		if err != nil {
			return fmt.Errorf("%s/%w", name, err)
		}
	}
	return nil
}

// canExec reports whether the sandbox user may execute a file with this stat.
func (id identity) canExec(st *unix.Stat_t) bool {
	switch {
	case int(st.Uid) == id.uid:
		return st.Mode&0o100 != 0
	case int(st.Gid) == id.gid:
		return st.Mode&0o010 != 0
	}
	return st.Mode&0o001 != 0
}
