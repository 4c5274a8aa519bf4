package storekeys

import "strings"

// The fleet's records: the replicas that serve from one store, and the MCP sessions any
// of them may be asked to serve.
//
//	fleet/id                      the fleet's name: labels its sandboxes (made once)
//	fleet/replicas/{instance}     a replica: its advertised address, when it last said so
//	fleet/sessions/{session id}   an MCP session: its project, owner and handshake
//	fleet/handles/{handle}        a session of the stateless revision (session_start's
//	                              handle, or a default session): its project and owner
const (
	fleetRoot = "fleet/"
	// FleetID is the fleet's name, made by the first replica that joins: the sandboxes
	// the fleet's replicas start carry it, so that a fleet tells its own from those of
	// another deployment sharing the provider's account.
	FleetID = fleetRoot + "id"
	// FleetReplicas is the folder of the replicas' records.
	FleetReplicas = fleetRoot + "replicas/"
	// FleetSessions is the folder of the MCP sessions' records.
	FleetSessions = fleetRoot + "sessions/"
	// FleetHandles is the folder of the stateless revision's sessions' records.
	FleetHandles = fleetRoot + "handles/"
)

// FleetHandle is the key of the record of the stateless session named handle
// (ValidHandle).
func FleetHandle(handle string) string { return FleetHandles + handle }

// ValidHandle reports whether s can be a stateless session's handle as the server mints
// them: a project id, '-', and six lowercase hex digits. Handles come from clients: anything
// else names no session.
func ValidHandle(s string) bool {
	i := strings.LastIndexByte(s, '-')
	if i < 0 || len(s)-i-1 != 6 || ValidProject(s[:i]) != nil {
		return false
	}
	for _, c := range s[i+1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// FleetReplica is the key of the record of the replica named instance (ValidFleetName).
func FleetReplica(instance string) string { return FleetReplicas + instance }

// FleetSession is the key of the record of the MCP session id (ValidFleetName).
func FleetSession(id string) string { return FleetSessions + id }

// ValidFleetName reports whether s can name a replica or a session in a key: 1 to 64
// letters and digits. Ids come from clients and from the store: anything else is refused.
func ValidFleetName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
