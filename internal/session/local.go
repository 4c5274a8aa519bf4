package session

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// localArchive is a snapshot on this host's disk: a rotation's archive, kept when the
// store would not take it.
type localArchive struct {
	path    string
	size    int64
	retryAt time.Time // when to offer it to the store again
}

// remove deletes the file; nil-safe.
func (l *localArchive) remove() {
	if l != nil {
		os.Remove(l.path)
	}
}

// createFrom makes a sandbox and extracts the local archive into it.
func (s *Workspace) createFrom(ctx context.Context, l *localArchive) (sandbox.Sandbox, error) {
	if err := s.fenced(); err != nil {
		return nil, err
	}
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("open the local snapshot: %w", err)
	}
	defer f.Close()
	sb, err := s.cfg.Provider.Create(ctx, s.cfg.Sandbox)
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	if err := sb.Extract(ctx, f); err != nil {
		sb.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("extract the local snapshot into sandbox %s: %w", sb.ID(), err)
	}
	return sb, nil
}

// keepLocal makes l the newest snapshot, held by this host only.
func (s *Workspace) keepLocal(l *localArchive) {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	if s.local != nil && s.local != l {
		s.local.remove()
	}
	l.retryAt = s.clock.Now().Add(s.cfg.RetryInterval)
	s.local = l
}

// takeLocal returns the local snapshot, if any, and forgets it.
func (s *Workspace) takeLocal() *localArchive {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	l := s.local
	s.local = nil
	return l
}

// storedNewer: a save to the store succeeded, so a local snapshot is no longer the newest.
func (s *Workspace) storedNewer() {
	if l := s.takeLocal(); l != nil {
		s.log.Info("session: the store holds a newer snapshot than the one kept on this host; dropping that one")
		l.remove()
	}
}

// flushLocal offers the local snapshot to the store again, when it is due. It holds the
// session's write lock: no other save runs meanwhile, so this older archive cannot land
// after a newer one.
func (s *Workspace) flushLocal(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.localMu.Lock()
	l := s.local
	s.localMu.Unlock()
	if s.closed || l == nil || s.clock.Now().Before(l.retryAt) || s.fenced() != nil {
		return
	}
	if err := s.uploadLocal(ctx, l); err != nil {
		s.log.Error("session: the store still does not take the snapshot kept on this host; trying again later", "err", err)
		l.retryAt = s.clock.Now().Add(s.cfg.RetryInterval)
		return
	}
	s.log.Warn("session: the snapshot kept on this host since a last-call rotation is now in the store")
	s.takeLocal().remove()
}

func (s *Workspace) uploadLocal(ctx context.Context, l *localArchive) error {
	f, err := os.Open(l.path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = s.cfg.Snapshots.SaveLabeled(ctx, s.cfg.ProjectID, "rotation (kept on this host until the store took it)", func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
	return err
}
