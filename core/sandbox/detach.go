package sandbox

import "context"

// Detacher is a sandbox that lives apart from the process that opened it (E2B's, on
// E2B's machines) and can be let go of without ending it: Detach releases what this
// process holds of it (connections, preview listeners) and leaves the sandbox, its files
// and its processes running until its own end time, for another process to reconnect to
// by its ID. After Detach the value answers ErrClosed, as after Close; the sandbox does
// not. A sandbox that dies with its process (a local one) has no such ability: a caller
// that would detach it closes it.
type Detacher interface {
	Detach(ctx context.Context) error
}
