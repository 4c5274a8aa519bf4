// Package procnet reads the kernel's TCP tables (/proc/net/tcp and tcp6) and the socket
// inodes processes hold, so a sandbox's agent (or a provider reading them remotely) can
// tell which ports the sandbox's own processes listen on.
package procnet
