package e2b

import "context"

// Detach lets the sandbox go without killing it (sandbox.Detacher): this process's
// connections and preview listeners are closed, the sandbox runs on at E2B until its end
// time, and a process that connects to it by ID (another replica of a fleet) takes it
// up. The quota ledger keeps it open: it still runs.
func (s *Sandbox) Detach(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.markGone("was handed over to another process")
		s.previews.close()
		s.client.Close()
		s.log.Info("e2b: sandbox detached, left running", "sandbox", s.id)
	})
	return nil
}
