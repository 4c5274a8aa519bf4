//go:build linux && !(amd64 || arm64)

package seccomp

// nativeArch is nil where no syscall table exists: Program fails with ErrUnsupported.
var nativeArch *arch
