//go:build linux

// Package agent is the in-sandbox side of the data plane: the envd-compatible server that
// runs as pid 1 of a local sandbox (re-executed from the host's own binary, or built alone
// as cmd/toolhost-agent for a remote provider to ship). It runs commands (foreground with a
// deadline, background with a log file) and reaps every child, reads and writes files
// within the workspace, packs and extracts the workspace from the sandbox's own view, lists
// the ports the sandbox's processes listen on and tunnels to them.
package agent
