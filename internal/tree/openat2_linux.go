package tree

import "golang.org/x/sys/unix"

// openat2Beneath opens the directory rel below dfd in one call the kernel resolves
// without leaving dfd and without following any link (Linux 5.6 and later); on an older
// kernel, or any failure, the caller walks part by part.
func openat2Beneath(dfd int, rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(dfd, rel, &how)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
