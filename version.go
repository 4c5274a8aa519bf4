package toolhost

import (
	"runtime"
	"runtime/debug"
)

// Module is this module's path.
const Module = "github.com/toolhost/toolhost"

// BuildInfo says which toolhost a binary holds, from the build information the Go
// toolchain records (debug.ReadBuildInfo).
type BuildInfo struct {
	// Version is the module version: v1.2.3 for `go install ...@v1.2.3`, a pseudo-version
	// for a build from a clone with VCS stamping, "(devel)" or "" otherwise.
	Version string
	// Revision is the VCS commit the binary was built from, when it was stamped; Modified
	// says the work tree had changes.
	Revision string
	Modified bool
	// Go is the toolchain, e.g. go1.26.8.
	Go string
}

// ReadBuildInfo reports the toolhost module of this binary: the main module for the CLI,
// the dependency for a program that embeds toolhost.
func ReadBuildInfo() BuildInfo {
	bi := BuildInfo{Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return bi
	}
	if info.Main.Path == Module {
		bi.Version = info.Main.Version
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				bi.Revision = s.Value
			case "vcs.modified":
				bi.Modified = s.Value == "true"
			}
		}
		return bi
	}
	for _, d := range info.Deps {
		if d.Path == Module {
			if d.Replace != nil {
				d = d.Replace
			}
			bi.Version = d.Version
		}
	}
	return bi
}
