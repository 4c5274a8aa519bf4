package host

import (
	"maps"
	"slices"
)

// What a session's record carries to the session that takes over when this one's process
// died (internal/sessionstate): which plugin started which background process and
// terminal (only that plugin may ask after it and stop it), and a plugin's session
// state the next session starts from (the shell's working directory).

// Owned is a background process or terminal a plugin of the session started.
type Owned struct {
	Plugin  string
	ID      string
	LogPath string // a background process's; "" for a terminal
}

// OwnedProcesses lists the background processes the session's plugins started, by plugin
// then age (the newest last).
func (s *Dispatcher) OwnedProcesses() []Owned {
	s.owned.mu.Lock()
	defer s.owned.mu.Unlock()
	var out []Owned
	for _, plugin := range slices.Sorted(maps.Keys(s.owned.procs)) {
		for _, p := range s.owned.procs[plugin] {
			out = append(out, Owned{Plugin: plugin, ID: p.id, LogPath: p.logPath})
		}
	}
	return out
}

// OwnedTerminals lists the terminals the session's plugins started.
func (s *Dispatcher) OwnedTerminals() []Owned {
	s.owned.mu.Lock()
	defer s.owned.mu.Unlock()
	var out []Owned
	for _, plugin := range slices.Sorted(maps.Keys(s.owned.terms)) {
		for _, id := range s.owned.terms[plugin] {
			out = append(out, Owned{Plugin: plugin, ID: id})
		}
	}
	return out
}

// AdoptProcess makes the background process id (logging to logPath) plugin's, as if it had
// started it in this session: a session that took over from a dead one gives each plugin
// back what it started there.
func (s *Dispatcher) AdoptProcess(plugin, id, logPath string) {
	s.owned.addProc(plugin, id, logPath)
}

// AdoptTerminal makes the terminal id plugin's, as AdoptProcess does a process.
func (s *Dispatcher) AdoptTerminal(plugin, id string) {
	s.owned.addTerm(plugin, id)
}

// PluginState is a plugin's session value for key (toolhost_session.get), if any.
func (s *Dispatcher) PluginState(plugin, key string) ([]byte, bool) {
	return s.state.get(plugin, key)
}

// SetPluginState sets a plugin's session value for key, within the same bounds as the
// plugin's own set (an empty value deletes it).
func (s *Dispatcher) SetPluginState(plugin, key string, value []byte) bool {
	if !stateKeyRE().MatchString(key) {
		return false
	}
	st, _ := s.state.set(plugin, key, value)
	return st == 0
}

// PluginStates is a copy of every plugin's session values, by plugin then key: what a
// session's record carries so that the session taking over starts from it (the files the
// model has read, for edit_file's guard).
func (s *Dispatcher) PluginStates() map[string]map[string][]byte {
	return s.state.all()
}
