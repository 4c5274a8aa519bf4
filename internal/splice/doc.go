// Package splice copies two connections into each other until both directions end,
// passing a half-close on: the tunnel under previews and the agent's port dial.
package splice
