package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/toolhost/toolhost/pdk"
)

// Guarded writes: edit_file and write_file change an existing file only when this session
// has seen its current contents, so a change made behind the model's back (a formatter, a
// background process, the model's own sed) is never overwritten unseen. read_file records
// the version (the SHA-256 of the contents) it showed; write_file, edit_file and
// apply_patch record the version they wrote. The record is the plugin's session state: it
// is per session, survives every replacement of the sandbox, and is never in the sandbox.
// A new file is never refused. The embedder turns the guard off with
// TOOLHOST_EDITFILE_GUARD=off in the plugin's env.

const envGuard = "TOOLHOST_EDITFILE_GUARD"

func guardOn() bool {
	switch strings.ToLower(strings.TrimSpace(pdk.Config(envGuard))) {
	case "off", "0", "false", "no":
		return false
	}
	return true
}

// seenKey is the state key of a file: the digest of its workspace-relative path, so any
// path makes a valid key.
func seenKey(path string) string {
	sum := sha256.Sum256([]byte(relPath(path)))
	return "seen/" + hex.EncodeToString(sum[:16])
}

// markSeen records that the session has seen (or written) version of path.
func markSeen(path, version string) {
	if version != "" && guardOn() {
		_ = pdk.SessionSet(seenKey(path), []byte(version))
	}
}

// forget drops the record of a file that is gone.
func forget(path string) {
	if guardOn() {
		_ = pdk.SessionSet(seenKey(path), nil)
	}
}

func versionOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// guard says why the file at path, whose current version is current, may not be changed
// by verb ("edit", "overwrite"; past "edited", "overwritten"), or "".
func guard(path, current, verb, past string) string {
	if !guardOn() {
		return ""
	}
	rec, err := pdk.SessionGet(seenKey(path))
	switch {
	case err != nil:
		return "Error: " + path + " has not been read in this session, so it cannot be " + past + " unseen: read it with read_file first, then " + verb + " it"
	case string(rec) != current:
		return "Error: " + path + " has changed since you last read it (a command, a background process or another tool wrote it): read it again with read_file, then redo the " + verb + " on what is there now"
	}
	return ""
}
