//go:build linux

package pluginreg

import (
	"fmt"
	"io/fs"
	"syscall"
	"time"
)

// stampOf is what changes whenever a file's bytes may have: its device, inode, size,
// modification time and change time. No one but root can set a change time, so a file
// written after its stamp was taken has another stamp. "" when there is no stamp to
// trust: a file changed within the last second (a write in the same tick could keep the
// times; as git's racy index entries).
func stampOf(fi fs.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	ctime := time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	if time.Since(ctime) < time.Second || time.Since(fi.ModTime()) < time.Second {
		return ""
	}
	return fmt.Sprintf("%d %d %d %d %d", st.Dev, st.Ino, st.Size, fi.ModTime().UnixNano(), ctime.UnixNano())
}
