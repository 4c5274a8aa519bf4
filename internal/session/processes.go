package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Background processes survive rotation: the session remembers each one started through
// Start (argv, working directory, environment, and its tag, which names its id and log
// file), and after the work moved to a new sandbox it starts again those still running
// in the old one, under the same tag, so the id and the log path stay the same (the log
// starts empty: /tmp is the sandbox's own). Previews of the ports that were listening wait
// for them to listen again, the dev server's auto-capture re-arms, and the next tool
// result tells the agent, once, what was restarted (Notice).

const (
	// maxRemembered bounds the background processes a session carries over (the newest).
	maxRemembered = 16
	// restartWait is how long, after a restart, a preview of a port that was listening
	// before waits for it to listen again.
	restartWait = 30 * time.Second
	// listTimeout bounds asking the old sandbox which processes and ports are alive.
	listTimeout = 5 * time.Second
)

// bgProc is a background process started through the session.
type bgProc struct {
	tag     string
	argv    []string
	cwd     string
	env     map[string]string // nil for one taken over: its record keeps none (plugins' secrets)
	pid     int
	logPath string
}

type bgState struct {
	mu          sync.Mutex
	procs       []*bgProc   // oldest first
	terms       []*termProc // terminals, oldest first (terminals.go)
	notice      string
	expect      map[int]bool // ports expected to listen again after a restart
	expectUntil time.Time    // wall clock
}

// Start runs a background process, remembers it so a rotation can restart it, and when it
// starts listening on a new port (a dev server), remembers the port and captures the page
// on its own.
func (s *Workspace) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	before, _ := s.listening(ctx)
	proc, err := do(ctx, s, func(sb sandbox.Sandbox) (sandbox.Process, error) { return sb.Start(ctx, req) })
	if err != nil {
		return proc, err
	}
	s.remember(req, proc)
	// Launched under the read lock: Close sets closed under the write lock before it
	// waits, so no goroutine is added once it waits.
	s.mu.RLock()
	if !s.closed {
		s.wg.Go(func() { s.watchDevServer(s.loopCtx, before, false) })
	}
	s.mu.RUnlock()
	return proc, nil
}

func (s *Workspace) remember(req sandbox.ExecRequest, proc sandbox.Process) {
	if proc.ID == "" {
		return // a provider without tags cannot restart it under the same name
	}
	p := &bgProc{tag: proc.ID, argv: slices.Clone(req.Argv), cwd: req.Cwd, env: maps.Clone(req.Env), pid: proc.PID, logPath: proc.LogPath}
	defer s.changed()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	s.bg.procs = slices.DeleteFunc(s.bg.procs, func(o *bgProc) bool { return o.tag == p.tag })
	s.bg.procs = append(s.bg.procs, p)
	if n := len(s.bg.procs) - maxRemembered; n > 0 {
		s.log.Warn("session: more background processes than a rotation carries over; forgetting the oldest",
			"forgotten", n, "kept", maxRemembered)
		s.bg.procs = slices.Delete(s.bg.procs, 0, n)
	}
}

// rememberedProcs is every remembered process.
func (s *Workspace) rememberedProcs() []*bgProc {
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	return slices.Clone(s.bg.procs)
}

// runningProcs asks old which remembered processes still run, and forgets the others
// (exited, or killed by the agent). When old cannot say, all are taken as running.
func (s *Workspace) runningProcs(ctx context.Context, old sandbox.Sandbox) []*bgProc {
	all := s.rememberedProcs()
	pl, ok := sandbox.As[sandbox.ProcessLister](old)
	if len(all) == 0 || !ok {
		return all
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	infos, err := pl.Processes(ctx)
	if err != nil {
		s.log.Warn("session: cannot tell which background processes still run; restarting all remembered", "err", err)
		return all
	}
	alive := map[string]bool{}
	for _, in := range infos {
		alive[in.ID] = true
	}
	defer s.changed()
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	s.bg.procs = slices.DeleteFunc(s.bg.procs, func(p *bgProc) bool { return !alive[p.tag] })
	return slices.Clone(s.bg.procs)
}

// listeningOn lists the ports sb's processes listen on (not through the session: the
// caller may hold its lock).
func (s *Workspace) listeningOn(ctx context.Context, sb sandbox.Sandbox) ([]int, error) {
	pl, ok := sandbox.As[sandbox.PortLister](sb)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	ps, err := pl.Ports(ctx)
	ports := make([]int, len(ps))
	for i, p := range ps {
		ports[i] = p.Port
	}
	return ports, err
}

// restartProcs starts procs again in next under their old tags, sets the notice for the
// agent, makes previews of ports wait for them to listen again and re-arms the dev
// server's auto-capture. Called with mu held for writing. It returns how many started.
func (s *Workspace) restartProcs(ctx context.Context, next sandbox.Sandbox, procs []*bgProc, terms []*termProc, ports []int, why, files string) int {
	termLines := s.restartTerms(ctx, next, terms)
	if len(procs) == 0 {
		if files != filesKept || len(termLines) > 0 { // work was lost: the agent must know, processes or not
			s.bg.mu.Lock()
			s.bg.notice = termNotice(fmt.Sprintf("[Note: the sandbox was replaced (%s); %s.]", why, files), termLines)
			s.bg.mu.Unlock()
		}
		return 0
	}
	var lines []string
	started := 0
	for _, p := range procs {
		np, err := next.Start(ctx, sandbox.ExecRequest{Argv: p.argv, Cwd: p.cwd, Env: p.env, Tag: p.tag})
		if err != nil {
			s.log.Warn("session: a background process could not be restarted", "id", p.tag, "argv", p.argv, "err", err)
			lines = append(lines, fmt.Sprintf("- %s could NOT be restarted; start it again if you need it: %s", p.tag, display(p.argv)))
			continue
		}
		started++
		s.bg.mu.Lock()
		p.pid, p.logPath = np.PID, np.LogPath
		s.bg.mu.Unlock()
		lines = append(lines, fmt.Sprintf("- %s, now pid %d, log %s: %s", np.ID, np.PID, np.LogPath, display(p.argv)))
	}
	notice := fmt.Sprintf("[Note: the sandbox was replaced (%s); %s. "+
		"Background processes were restarted in the new sandbox with the same ids and log files (their earlier output is gone):\n%s]",
		why, files, strings.Join(lines, "\n"))
	s.bg.mu.Lock()
	s.bg.notice = termNotice(notice, termLines)
	// A port still expected from an earlier restart (its server had not come back when
	// this rotation began) is expected again: the processes restarted here include it.
	expect := map[int]bool{}
	for p := range s.bg.expect {
		if time.Now().Before(s.bg.expectUntil) {
			expect[p] = true
		}
	}
	for _, p := range ports {
		expect[p] = true
	}
	if len(expect) > 0 {
		s.bg.expect = expect
		s.bg.expectUntil = time.Now().Add(restartWait)
	}
	s.bg.mu.Unlock()
	if port := s.devPort; port != 0 && s.cfg.Screenshots != nil && !s.closed {
		s.wg.Go(func() { s.watchDevServer(s.loopCtx, nil, true) })
	}
	return started
}

// display is a command as the agent wrote it: the script of bash -c, else the argv.
func display(argv []string) string {
	var s string
	if len(argv) == 3 && (argv[0] == "bash" || argv[0] == "sh") && argv[1] == "-c" {
		s = argv[2]
	} else {
		q := make([]string, len(argv))
		for i, a := range argv {
			q[i] = a
			if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
				q[i] = strconv.Quote(a)
			}
		}
		s = strings.Join(q, " ")
	}
	// What the agent sees of a command may come from a record in the store: no control
	// character reaches it.
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return ' '
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// Notice returns, once, what the agent should be told about the session since the last
// tool result (the background processes a rotation restarted), or "". The host appends
// it to the next tool result.
func (s *Workspace) Notice() string {
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	n := s.bg.notice
	s.bg.notice = ""
	return n
}

// expecting reports whether port listened before a restart and may come back.
func (s *Workspace) expecting(port int) bool {
	s.bg.mu.Lock()
	defer s.bg.mu.Unlock()
	return s.bg.expect[port] && time.Now().Before(s.bg.expectUntil)
}

// PreviewURL maps a port of the current sandbox. Right after a rotation restarted the
// process that listened on it, it waits (up to restartWait) for the port to listen again,
// so a screenshot after a rotation needs nothing of the agent. The wait asks the sandbox
// which ports are listened on (a remote provider's preview URL exists whether or not
// anything listens behind it); a sandbox that cannot tell is trusted to refuse a closed
// port itself.
func (s *Workspace) PreviewURL(ctx context.Context, port int) (*url.URL, error) {
	for s.expecting(port) {
		ports, listed, err := s.listeningNow(ctx)
		if err != nil || !listed || slices.Contains(ports, port) {
			break
		}
		t := time.NewTimer(devServerPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	for {
		u, err := do(ctx, s, func(sb sandbox.Sandbox) (*url.URL, error) { return sb.PreviewURL(ctx, port) })
		if err == nil {
			s.bg.mu.Lock()
			delete(s.bg.expect, port)
			s.bg.mu.Unlock()
		}
		if err == nil || !errors.Is(err, sandbox.ErrPortClosed) || !s.expecting(port) {
			return u, err
		}
		t := time.NewTimer(devServerPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// listeningNow lists the ports the current sandbox's processes listen on; listed is false
// when the sandbox cannot tell.
func (s *Workspace) listeningNow(ctx context.Context) (ports []int, listed bool, err error) {
	sb, release, err := s.current(ctx, 0)
	if err != nil {
		return nil, false, err
	}
	defer release()
	if _, ok := sandbox.As[sandbox.PortLister](sb); !ok {
		return nil, false, nil
	}
	ports, err = s.listeningOn(ctx, sb)
	return ports, true, err
}
