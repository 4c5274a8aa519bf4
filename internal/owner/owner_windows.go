//go:build windows

package owner

import (
	"io/fs"
	"unsafe"

	"golang.org/x/sys/windows"
)

// other_ compares the owner SID of path with this process's user and with the owner its
// token gives new objects (for an elevated administrator that is the Administrators
// group, so what it made is still its own).
func otherOwner(path string, _ fs.FileInfo) (string, bool) {
	sd, err := windows.GetNamedSecurityInfo(path, windows.SE_FILE_OBJECT, windows.OWNER_SECURITY_INFORMATION)
	if err != nil {
		return "an owner that cannot be read (" + err.Error() + ")", true
	}
	owner, _, err := sd.Owner()
	if err != nil || owner == nil {
		return "an owner that cannot be read", true
	}
	tok := windows.GetCurrentProcessToken()
	if u, err := tok.GetTokenUser(); err == nil && owner.Equals(u.User.Sid) {
		return "", false
	}
	if d := defaultOwner(tok); d != nil && owner.Equals(d) {
		return "", false
	}
	return owner.String(), true
}

func defaultOwner(tok windows.Token) *windows.SID {
	var n uint32
	_ = windows.GetTokenInformation(tok, windows.TokenOwner, nil, 0, &n)
	if n == 0 {
		return nil
	}
	buf := make([]byte, n)
	if err := windows.GetTokenInformation(tok, windows.TokenOwner, &buf[0], n, &n); err != nil {
		return nil
	}
	return (*tokenOwner)(unsafe.Pointer(&buf[0])).Owner
}

// tokenOwner is TOKEN_OWNER.
type tokenOwner struct{ Owner *windows.SID }
