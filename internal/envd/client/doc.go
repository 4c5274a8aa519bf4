// Package client is the host's side of the sandbox data plane: one client of the envd
// protocol (package envd) that serves both the local provider, whose agent is ours
// (package agent), and E2B, whose envd is theirs. Everything it reads comes from inside a
// sandbox, so every reply is bounded (frames, archives, trailers) and every wait has the
// client's own deadline (an idle watchdog, and a grace past each command's timeout).
package client
