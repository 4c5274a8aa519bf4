//go:build unix

package haproxytest

import "syscall"

// softStop is HAProxy's soft stop: stop listening, finish what is in flight, exit 0.
const softStop = syscall.SIGUSR1
