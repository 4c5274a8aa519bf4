//go:build !windows

package tree

// CheckPlatform reports why this platform would create the entry p (with the link target
// target, unless "") as another file, or nil. On unix, Check's rules are all there is.
func CheckPlatform(p, target string) error { return nil }
