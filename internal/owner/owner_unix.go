//go:build !windows

package owner

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

func otherOwner(_ string, fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) == os.Geteuid() {
		return "", false
	}
	return fmt.Sprintf("uid %d", st.Uid), true
}
