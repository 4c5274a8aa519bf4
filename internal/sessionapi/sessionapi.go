// Package sessionapi is the wire of the session daemon (toolhost serve --socket): the
// sessions the shell holds between CLI calls, as JSON over HTTP on a unix socket, and the
// client the CLI uses. The server is package mcpserve's SessionAPI.
//
//	GET    /v1/daemon                   Info
//	POST   /v1/sessions                 StartRequest -> Session (201)
//	GET    /v1/sessions                 List
//	POST   /v1/sessions/{id}/calls      CallRequest -> abi.Result
//	POST   /v1/sessions/{id}/commit     CommitRequest -> Snapshot
//	DELETE /v1/sessions/{id}            Snapshot (the commit at its end)
//	POST   /v1/calls                    OneShotRequest -> abi.Result
//
// Errors are Error with a status: 400 a request the caller should fix (an unknown tool,
// a bad workspace), 404 no such session, 409 the daemon runs another configuration, 503
// the daemon is shutting down or full, 500 the host could not do it. A one-shot call
// (POST /v1/calls) answers 412 when the daemon runs another configuration and 503 when it
// is shutting down: in both cases nothing ran, and the caller runs the call itself.
package sessionapi

import (
	"encoding/json"
	"time"
)

// Info describes the daemon.
type Info struct {
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	// ConfigDigest identifies the configuration the daemon runs with (see
	// ConfigDigestHeader).
	ConfigDigest string `json:"config_digest"`
	Sessions     int    `json:"sessions"`
	// TakesCalls: the daemon takes one-shot calls (POST /v1/calls) now, its plugins
	// compiled; OneShots counts those it has run.
	TakesCalls bool  `json:"takes_calls"`
	OneShots   int64 `json:"one_shots"`
}

// ConfigDigestHeader carries the client's configuration digest on the requests whose
// meaning depends on it (starting a session, finding a project's): a daemon with another
// configuration (another store, another provider) refuses them with 409.
const ConfigDigestHeader = "Toolhost-Config-Digest"

// StartRequest opens a session.
type StartRequest struct {
	Project string `json:"project"`
	// Workspace is a host directory mounted as the sandbox's workspace; empty: the
	// project's private workspace, woken from its newest snapshot.
	Workspace string `json:"workspace,omitempty"`
	// IdleTimeoutMS ends the session after this long without a call (its work committed);
	// 0: the daemon's default.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
}

// Held is a session the daemon holds.
type Held struct {
	ID        string `json:"id"`
	Project   string `json:"project"`
	Workspace string `json:"workspace,omitempty"` // empty: the project's private workspace
	// WokeFrom is the snapshot the private workspace was restored from; empty for a new
	// project or a host directory.
	WokeFrom      string    `json:"woke_from,omitempty"`
	Started       time.Time `json:"started"`
	LastCall      time.Time `json:"last_call"`
	Calls         int64     `json:"calls"`
	IdleTimeoutMS int64     `json:"idle_timeout_ms"`
	// ReadyMS is how long the session took to open (its sandbox started, its workspace
	// woken).
	ReadyMS int64 `json:"ready_ms"`
}

// List is the daemon's sessions, oldest first.
type List struct {
	Sessions []Held `json:"sessions"`
}

// CallRequest runs one tool call in a session.
type CallRequest struct {
	Tool  string          `json:"tool"`
	Input json.RawMessage `json:"input"`
}

// OneShotRequest runs one tool call as a session of its own, what a plain `toolhost
// call` does in its own process: a session of Project opened on Workspace (a host
// directory, absolute; empty: the project's private workspace, committed after the
// call), the call, the session closed.
type OneShotRequest struct {
	Project   string          `json:"project"`
	Workspace string          `json:"workspace,omitempty"`
	Tool      string          `json:"tool"`
	Input     json.RawMessage `json:"input"`
}

// CommitRequest saves a snapshot of a session's workspace.
type CommitRequest struct {
	Label string `json:"label,omitempty"`
}

// Snapshot is a commit's result.
type Snapshot struct {
	Key       string `json:"key"`
	Bytes     int64  `json:"bytes"`
	Unchanged bool   `json:"unchanged,omitempty"`
}

// Error is the body of every error answer.
type Error struct {
	Error string `json:"error"`
}
