package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Terminals survive rotation as background processes do: the session remembers each
// program it started on a terminal (argv, working directory, environment, size, tag), and
// after the work moved to a new sandbox it starts again those still running in the old
// one, under the same tag. What the program held in memory (a REPL's variables) is gone,
// so the next call on that terminal says it was restarted, and the rotation's notice
// lists it.

var _ sandbox.Terminals = (*Workspace)(nil)

// termProc is a terminal started through the session.
type termProc struct {
	req       sandbox.TerminalRequest // with its Tag
	restarted bool                    // since the last call on it
}

// StartTerminal starts a program on a terminal of the current sandbox and remembers it.
func (s *Workspace) StartTerminal(ctx context.Context, req sandbox.TerminalRequest, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	out, err := doOp(ctx, s, w.Wait, false, func(sb sandbox.Sandbox) (sandbox.TerminalOutput, error) {
		t, ok := sandbox.As[sandbox.Terminals](sb)
		if !ok {
			return sandbox.TerminalOutput{}, fmt.Errorf("sandbox %s cannot run programs on a terminal: %w", sb.ID(), sandbox.ErrUnsupported)
		}
		return t.StartTerminal(ctx, req, w)
	})
	if err != nil || out.Exited || out.ID == "" {
		return out, err
	}
	r := req
	r.Argv, r.Env, r.Tag = slices.Clone(req.Argv), maps.Clone(req.Env), out.ID
	defer s.changed()
	s.bg.mu.Lock()
	s.bg.terms = append(s.bg.terms, &termProc{req: r})
	if n := len(s.bg.terms) - maxRemembered; n > 0 {
		s.bg.terms = slices.Delete(s.bg.terms, 0, n)
	}
	s.bg.mu.Unlock()
	return out, nil
}

// TerminalIO talks to a terminal of the current sandbox. A terminal whose program ended
// (or that the sandbox no longer has) is forgotten.
func (s *Workspace) TerminalIO(ctx context.Context, id string, input []byte, sig sandbox.Signal, w sandbox.TerminalWait) (sandbox.TerminalOutput, error) {
	out, err := doOp(ctx, s, w.Wait, false, func(sb sandbox.Sandbox) (sandbox.TerminalOutput, error) {
		t, ok := sandbox.As[sandbox.Terminals](sb)
		if !ok {
			return sandbox.TerminalOutput{}, fmt.Errorf("sandbox %s cannot run programs on a terminal: %w", sb.ID(), sandbox.ErrUnsupported)
		}
		return t.TerminalIO(ctx, id, input, sig, w)
	})
	gone := out.Exited || errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, fs.ErrNotExist)
	if gone {
		defer s.changed()
	}
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	i := slices.IndexFunc(s.bg.terms, func(t *termProc) bool { return t.req.Tag == id })
	if i >= 0 {
		if err == nil {
			out.Restarted, s.bg.terms[i].restarted = s.bg.terms[i].restarted, false
		}
		if gone {
			s.bg.terms = slices.Delete(s.bg.terms, i, i+1)
		}
	}
	return out, err
}

// runningTerms asks old which remembered terminals still run their program, and forgets
// the others. When old cannot say, all are taken as running.
func (s *Workspace) runningTerms(ctx context.Context, old sandbox.Sandbox) []*termProc {
	s.bg.mu.Lock()
	all := slices.Clone(s.bg.terms)
	s.bg.mu.Unlock()
	pl, ok := sandbox.As[sandbox.ProcessLister](old)
	if len(all) == 0 || !ok {
		return all
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	infos, err := pl.Processes(ctx)
	if err != nil {
		return all
	}
	alive := map[string]bool{}
	for _, in := range infos {
		alive[in.ID] = true
	}
	defer s.changed()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	s.bg.terms = slices.DeleteFunc(s.bg.terms, func(t *termProc) bool { return !alive[t.req.Tag] })
	return slices.Clone(s.bg.terms)
}

// restartTerms starts terms again in next under their tags, without waiting for output,
// and returns the lines the rotation's notice gives them. Called with mu held for writing.
func (s *Workspace) restartTerms(ctx context.Context, next sandbox.Sandbox, terms []*termProc) []string {
	var lines []string
	t, ok := sandbox.As[sandbox.Terminals](next)
	for _, tp := range terms {
		var err error
		if !ok {
			err = errors.New("the new sandbox has no terminals")
		} else {
			_, err = t.StartTerminal(ctx, tp.req, sandbox.TerminalWait{})
		}
		s.bg.mu.Lock()
		if err != nil {
			s.bg.terms = slices.DeleteFunc(s.bg.terms, func(o *termProc) bool { return o == tp })
		} else {
			tp.restarted = true
		}
		s.bg.mu.Unlock()
		if err != nil {
			s.log.Warn("session: a terminal could not be restarted", "id", tp.req.Tag, "argv", tp.req.Argv, "err", err)
			lines = append(lines, fmt.Sprintf("- terminal %s could NOT be restarted; start it again if you need it: %s", tp.req.Tag, display(tp.req.Argv)))
			continue
		}
		lines = append(lines, fmt.Sprintf("- terminal %s was started again (what it held is gone): %s", tp.req.Tag, display(tp.req.Argv)))
	}
	return lines
}

// termNotice appends the terminals' lines to the notice of a replacement.
func termNotice(notice string, lines []string) string {
	if len(lines) == 0 {
		return notice
	}
	return strings.TrimSuffix(notice, "]") + "\nInteractive sessions:\n" + strings.Join(lines, "\n") + "]"
}
