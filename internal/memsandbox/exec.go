package memsandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// proc is one running program: its arguments, environment, directory and streams. The
// programs of a command share its context, which ends at the command's timeout, when its
// caller gives up, or when the sandbox closes: that is the whole process group dying.
type proc struct {
	s      *Sandbox
	ctx    context.Context
	args   []string
	env    map[string]string
	cwd    string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// jobs counts the background jobs of a foreground command (nil in a Start'ed
	// process): Exec waits for them once it has ended the command.
	jobs *sync.WaitGroup
}

// program is what a name in argv runs; it returns the exit status.
type program func(p *proc) int

var programs map[string]program

func init() {
	programs = map[string]program{
		"sh": runShell, "bash": runShell,
		"echo": echo, "cat": cat, "pwd": pwd, "sleep": sleep, "yes": yes,
		"true": func(*proc) int { return 0 }, "false": func(*proc) int { return 1 },
		"mkdir": mkdir, "ln": ln, "mkfifo": mkfifo, "chmod": chmod,
		"python3": python,
	}
}

func lookupProgram(name string) (program, bool) {
	pr, ok := programs[path.Base(name)]
	return pr, ok
}

// environ is the environment of a process: the sandbox's, then the request's.
func (s *Sandbox) environ(extra map[string]string) map[string]string {
	env := map[string]string{"HOME": sandbox.WorkspaceRoot, "USER": "user", "LANG": "C.UTF-8",
		"PATH": "/usr/local/bin:/usr/bin:/bin", "TERM": "dumb"}
	maps.Copy(env, s.env)
	maps.Copy(env, extra)
	return env
}

// workdir resolves a request's Cwd, which must be a directory.
func (s *Sandbox) workdir(cwd string) (string, error) {
	if cwd == "" {
		return sandbox.WorkspaceRoot, nil
	}
	abs, err := sandbox.Resolve(cwd)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, n, err := s.lookup(abs, true)
	switch {
	case err != nil:
		return "", fmt.Errorf("working directory %s: %w", cwd, err)
	case !n.dir:
		return "", fmt.Errorf("working directory %s: %w", cwd, sandbox.ErrNotDir)
	}
	return abs, nil
}

// Exec runs a command in the foreground. Background jobs it starts end with it.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	s.mu.Lock()
	if err := s.closedErr(); err != nil {
		s.mu.Unlock()
		return sandbox.ExecResult{}, err
	}
	s.Argvs = append(s.Argvs, cloneArgs(req.Argv))
	s.mu.Unlock()
	if len(req.Argv) == 0 {
		return sandbox.ExecResult{}, fmt.Errorf("exec in sandbox %s: empty argv", s.id)
	}
	prog, ok := lookupProgram(req.Argv[0])
	if !ok {
		return sandbox.ExecResult{}, fmt.Errorf("exec %s in sandbox %s: %w", req.Argv[0], s.id, errNoProgram)
	}
	cwd, err := s.workdir(req.Cwd)
	if err != nil {
		return sandbox.ExecResult{}, fmt.Errorf("exec in sandbox %s: %w", s.id, err)
	}
	limit := req.MaxOutputBytes
	if limit <= 0 {
		limit = sandbox.DefaultMaxOutputBytes
	}
	stdout, stderr := newHeadTail(limit), newHeadTail(limit)
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.life, cancel) // the sandbox closing kills the command
	defer stop()
	if req.Timeout > 0 {
		var c2 context.CancelFunc
		gctx, c2 = context.WithTimeout(gctx, req.Timeout)
		defer c2()
	}
	var jobs sync.WaitGroup
	p := &proc{s: s, ctx: gctx, args: req.Argv, env: s.environ(req.Env), cwd: cwd,
		stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, jobs: &jobs}
	code := prog(p)
	killed := gctx.Err() != nil
	// The command is over: the jobs it left behind end with it, before Exec returns, as a
	// process group killed whole.
	cancel()
	jobs.Wait()
	res := sandbox.ExecResult{ExitCode: code, Duration: time.Since(start)}
	res.Stdout, res.StdoutCut = stdout.result()
	res.Stderr, res.StderrCut = stderr.result()
	if killed {
		res.ExitCode, res.TimedOut = -1, true
		s.mu.Lock()
		err := s.endedErr() // it ran, until the end cut it short
		s.mu.Unlock()
		if err != nil {
			return res, err
		}
		if ctx.Err() != nil {
			return res, fmt.Errorf("exec %s in sandbox %s: %w", req.Argv[0], s.id, ctx.Err())
		}
	}
	return res, nil
}

func cloneArgs(a []string) []string { return append([]string(nil), a...) }

// Start runs a command in the background until it ends or the sandbox closes; its output
// goes to a log file under /tmp.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Process, error) {
	if len(req.Argv) == 0 {
		return sandbox.Process{}, fmt.Errorf("start in sandbox %s: empty argv", s.id)
	}
	prog, ok := lookupProgram(req.Argv[0])
	if !ok {
		return sandbox.Process{}, fmt.Errorf("start %s in sandbox %s: %w", req.Argv[0], s.id, errNoProgram)
	}
	cwd, err := s.workdir(req.Cwd)
	if err != nil {
		return sandbox.Process{}, fmt.Errorf("start in sandbox %s: %w", s.id, err)
	}
	s.mu.Lock()
	if err := s.closedErr(); err != nil {
		s.mu.Unlock()
		return sandbox.Process{}, err
	}
	s.bgSeq++
	s.pid++
	pr := sandbox.Process{ID: fmt.Sprintf("bg-%d", s.bgSeq), PID: s.pid, LogPath: fmt.Sprintf("/tmp/toolhost-bg-%d.log", s.bgSeq)}
	if err := s.write(pr.LogPath, nil, false); err != nil {
		s.mu.Unlock()
		return sandbox.Process{}, err
	}
	log := &fileWriter{s: s, path: pr.LogPath}
	p := &proc{s: s, ctx: s.life, args: cloneArgs(req.Argv), env: s.environ(req.Env), cwd: cwd,
		stdin: strings.NewReader(""), stdout: log, stderr: log}
	s.wg.Go(func() { prog(p) }) // owned by the sandbox: Close ends and waits for it
	s.mu.Unlock()
	return pr, nil
}

// fileWriter appends to a file of the sandbox.
type fileWriter struct {
	s    *Sandbox
	path string
}

func (w *fileWriter) Write(b []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if err := w.s.write(w.path, b, true); err != nil {
		return 0, err
	}
	return len(b), nil
}

// headTail keeps the first and the last bytes of a stream within limit and counts what it
// drops from the middle: the head gets half.
type headTail struct {
	mu    sync.Mutex
	limit int
	head  []byte
	tail  []byte
	total int64
}

func newHeadTail(limit int) *headTail { return &headTail{limit: max(limit, 2)} }

func (h *headTail) Write(b []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total += int64(len(b))
	rest := b
	if room := h.limit/2 - len(h.head); room > 0 {
		n := min(room, len(rest))
		h.head = append(h.head, rest[:n]...)
		rest = rest[n:]
	}
	if len(rest) > 0 {
		keep := h.limit - h.limit/2
		h.tail = append(h.tail, rest...)
		if len(h.tail) > keep {
			h.tail = append(h.tail[:0], h.tail[len(h.tail)-keep:]...)
		}
	}
	return len(b), nil
}

func (h *headTail) result() ([]byte, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append(append([]byte{}, h.head...), h.tail...)
	return out, h.total - int64(len(out))
}

// The programs.

func echo(p *proc) int {
	args, nl := p.args[1:], true
	if len(args) > 0 && args[0] == "-n" {
		args, nl = args[1:], false
	}
	s := strings.Join(args, " ")
	if nl {
		s += "\n"
	}
	io.WriteString(p.stdout, s)
	return 0
}

func pwd(p *proc) int {
	io.WriteString(p.stdout, p.cwd+"\n")
	return 0
}

func (p *proc) abs(name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(p.cwd, name)
}

// readFile reads a file of the sandbox for a program (anywhere in it, like a process).
func (p *proc) readFile(name string) ([]byte, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	abs, err := p.s.resolve(p.abs(name), true)
	if err != nil {
		return nil, err
	}
	n := p.s.files[abs]
	switch {
	case n == nil:
		return nil, fmt.Errorf("%s: No such file or directory", name)
	case n.dir:
		return nil, fmt.Errorf("%s: Is a directory", name)
	case n.fifo:
		return nil, fmt.Errorf("%s: a FIFO, which the memory sandbox does not open", name)
	}
	return bytes.Clone(n.data), nil
}

func cat(p *proc) int {
	if len(p.args) == 1 {
		io.Copy(p.stdout, p.stdin)
		return 0
	}
	code := 0
	for _, name := range p.args[1:] {
		b, err := p.readFile(name)
		if err != nil {
			fmt.Fprintf(p.stderr, "cat: %v\n", err)
			code = 1
			continue
		}
		p.stdout.Write(b)
	}
	return code
}

func sleep(p *proc) int {
	if len(p.args) != 2 {
		fmt.Fprintln(p.stderr, "sleep: missing operand")
		return 1
	}
	sec, err := strconv.ParseFloat(p.args[1], 64)
	if err != nil || sec < 0 {
		fmt.Fprintf(p.stderr, "sleep: invalid time interval %q\n", p.args[1])
		return 1
	}
	t := time.NewTimer(time.Duration(sec * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-p.ctx.Done():
		return -1
	}
}
