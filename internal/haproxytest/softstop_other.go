//go:build !unix

package haproxytest

import "syscall"

// softStop: no SIGUSR1 here (HAProxy runs on Unix; this only lets the package build).
const softStop = syscall.SIGTERM
