//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/toolhost/toolhost/internal/envd"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The agent's side of the terminals (terminal_wire.go). Each terminal has two goroutines,
// both owned by the terminal and both ending with its program: the reader, which moves the
// program's output from the pseudo-terminal into a bounded buffer until the terminal's
// other end is closed by everything that held it, and the waiter, which learns the
// program's exit status from the server's launcher. A request collects from the buffer;
// nothing the program writes waits for a request, so a program that talks while nobody
// asks never blocks on its terminal (the oldest output is dropped and counted instead).

// drainAfterExit bounds how long a collection waits, once the program has ended, for the
// rest of its output: a child it left behind may hold the terminal open for good.
const drainAfterExit = 500 * time.Millisecond

// inputTimeout bounds a write to a program that does not read its input.
const inputTimeout = 5 * time.Second

type terminal struct {
	tag  string
	pid  int
	ptmx *os.File

	mu         sync.Mutex
	buf        []byte
	dropped    int64
	lastOutput time.Time
	readerDone bool
	exited     bool
	exitedAt   time.Time
	status     exitStatus
	changed    chan struct{} // closed and replaced whenever any of the above changes

	io sync.Mutex // one request at a time
}

// terminals is the server's set of terminals, by tag.
type terminals struct {
	mu  sync.Mutex
	set map[string]*terminal
}

func (t *terminal) signalLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// read moves the program's output into the buffer until the terminal is closed at the
// other end (EIO) or fails.
func (t *terminal) read() {
	b := make([]byte, 16<<10)
	for {
		n, err := t.ptmx.Read(b)
		t.mu.Lock()
		if n > 0 {
			t.buf = append(t.buf, b[:n]...)
			if over := len(t.buf) - envd.MaxTerminalBuffer; over > 0 {
				t.buf = append(t.buf[:0], t.buf[over:]...)
				t.dropped += int64(over)
			}
			t.lastOutput = time.Now()
		}
		if err != nil {
			t.readerDone = true
		}
		t.signalLocked()
		t.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (s *Server) terminalStart(ctx context.Context, req *envd.TerminalStartRequest) (*envd.TerminalOutput, error) {
	if !validTag(req.Tag) || len(req.Tag) <= len(envd.TerminalTagPrefix) || req.Tag[:len(envd.TerminalTagPrefix)] != envd.TerminalTagPrefix {
		return nil, envd.BadArg("invalid terminal tag %q", req.Tag)
	}
	if req.Cols <= 0 || req.Cols > 1000 || req.Rows <= 0 || req.Rows > 1000 {
		return nil, envd.BadArg("terminal size %dx%d: cols and rows must be from 1 to 1000", req.Cols, req.Rows)
	}
	t, err := s.openTerminal(req)
	if err != nil {
		return nil, err
	}
	return s.collect(ctx, t, time.Now(), req.Wait)
}

// openTerminal starts the program on a new terminal and adds it to the set, under the
// set's lock so that two starts cannot pass the bound together.
func (s *Server) openTerminal(req *envd.TerminalStartRequest) (*terminal, error) {
	s.terms.mu.Lock()
	defer s.terms.mu.Unlock()
	if s.terms.set == nil {
		s.terms.set = map[string]*terminal{}
	}
	if _, dup := s.terms.set[req.Tag]; dup {
		return nil, fmt.Errorf("terminal %s: %w", req.Tag, sandbox.ErrExists)
	}
	if len(s.terms.set) >= envd.MaxTerminals {
		return nil, envd.BadArg("%d terminals are open, the most an agent keeps; end one first", envd.MaxTerminals)
	}
	cmd, err := s.command(envd.StartRequest{Process: req.Process, Tag: req.Tag})
	if err != nil {
		return nil, err
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(req.Cols), Rows: uint16(req.Rows)}); err != nil {
		ptmx.Close()
		tty.Close()
		return nil, fmt.Errorf("size the pseudo-terminal: %w", err)
	}
	if ptmx, err = pollable(ptmx); err != nil {
		tty.Close()
		return nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	// The program leads a session of its own whose controlling terminal is tty (its
	// stdin, descriptor 0), so Ctrl-C reaches its foreground job and the whole session
	// can be signalled as one group.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	pid, done, err := s.start(cmd, envd.StartRequest{Process: req.Process, Tag: req.Tag})
	tty.Close()
	if err != nil {
		ptmx.Close()
		if errors.Is(err, errShuttingDown) {
			return nil, err
		}
		return nil, envd.BadArg("start process: %v", err)
	}
	t := &terminal{tag: req.Tag, pid: pid, ptmx: ptmx, changed: make(chan struct{})}
	s.terms.set[req.Tag] = t
	s.wg.Add(2)
	go func() { // the reader, owned by the terminal: ends when its other end closes
		defer s.wg.Done()
		t.read()
	}()
	go func() { // the waiter, owned by the terminal: ends with the program
		defer s.wg.Done()
		st := <-done
		s.untrack(pid)
		t.mu.Lock()
		t.exited, t.exitedAt, t.status = true, time.Now(), st
		t.signalLocked()
		t.mu.Unlock()
		s.log.Debug("terminal program ended", "tag", req.Tag, "pid", pid, "status", st.desc)
	}()
	return t, nil
}

func (s *Server) terminalIO(ctx context.Context, req *envd.TerminalIORequest) (*envd.TerminalOutput, error) {
	s.terms.mu.Lock()
	t := s.terms.set[req.Tag]
	s.terms.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("terminal %s: %w", req.Tag, sandbox.ErrNotFound)
	}
	if len(req.Input) > envd.MaxTerminalInput {
		return nil, envd.BadArg("input of %d bytes is over the %d-byte bound of one write", len(req.Input), envd.MaxTerminalInput)
	}
	t.io.Lock()
	defer t.io.Unlock()
	began := time.Now()
	switch req.Signal {
	case "":
	case "INT", "TERM", "KILL":
		sig := map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL}[req.Signal]
		if err := syscall.Kill(-t.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return nil, fmt.Errorf("signal terminal %s: %w", req.Tag, err)
		}
	default:
		return nil, envd.BadArg("unsupported signal %q", req.Signal)
	}
	if len(req.Input) > 0 {
		if err := t.write(req.Input); err != nil {
			return nil, err
		}
	}
	return s.collect(ctx, t, began, req.Wait)
}

// pollable turns the terminal's end into a file of the runtime's poller: creack/pty
// leaves it in blocking mode (it takes Fd()), where a read waits in the kernel and Close
// cannot end it; a program's child that keeps the terminal open would then hold the
// reader, and the server's Close with it, for good. On the poller, Close ends a read and
// a write can have a deadline.
func pollable(f *os.File) (*os.File, error) {
	// Close-on-exec from the start: no program may inherit the terminal's other end.
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), nil
}

// write writes input to the program, bounded: a program that does not read fills the
// terminal's buffer, and then the write would wait for it forever.
func (t *terminal) write(input []byte) error {
	_ = t.ptmx.SetWriteDeadline(time.Now().Add(inputTimeout))
	_, err := t.ptmx.Write(input)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return envd.BadArg("terminal %s: the program has not read its input for %s", t.tag, inputTimeout)
	case err != nil:
		return fmt.Errorf("write to terminal %s: %w", t.tag, err)
	}
	return nil
}

// collect waits as w says, then takes what the buffer holds. began is when the request
// came: the program is given at least the quiet time after it to answer.
func (s *Server) collect(ctx context.Context, t *terminal, began time.Time, w envd.TerminalWaitSpec) (*envd.TerminalOutput, error) {
	wait := time.Duration(min(max(w.WaitMs, 0), envd.MaxTerminalWaitMs)) * time.Millisecond
	quiet := time.Duration(max(w.QuietMs, 1)) * time.Millisecond
	maxBytes := w.MaxBytes
	if maxBytes <= 0 || maxBytes > envd.MaxTerminalBuffer {
		maxBytes = envd.MaxTerminalBuffer
	}
	deadline := began.Add(wait)
	reason := envd.ReasonWait
	for {
		t.mu.Lock()
		now := time.Now()
		var next time.Time
		switch {
		case len(t.buf) >= maxBytes:
			reason = envd.ReasonFull
		case t.exited && (t.readerDone || now.Sub(t.exitedAt) >= drainAfterExit):
			reason = envd.ReasonExited
		case !now.Before(deadline):
			reason = envd.ReasonWait
		default:
			from := began
			if t.lastOutput.After(from) {
				from = t.lastOutput
			}
			if len(t.buf) > 0 && !now.Before(from.Add(quiet)) {
				reason = envd.ReasonQuiet
				break
			}
			next = deadline
			if len(t.buf) > 0 && from.Add(quiet).Before(next) {
				next = from.Add(quiet)
			}
			if t.exited && t.exitedAt.Add(drainAfterExit).Before(next) {
				next = t.exitedAt.Add(drainAfterExit)
			}
		}
		if next.IsZero() {
			return s.take(t, maxBytes, reason), nil
		}
		changed := t.changed
		t.mu.Unlock()
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// take empties up to maxBytes of the buffer into the reply. Called with t.mu held; it
// unlocks it. A terminal whose end the reply reports leaves the set.
func (s *Server) take(t *terminal, maxBytes int, reason string) *envd.TerminalOutput {
	n := min(len(t.buf), maxBytes)
	out := &envd.TerminalOutput{Tag: t.tag, Pid: t.pid, Output: append([]byte(nil), t.buf[:n]...), Dropped: t.dropped, Reason: reason}
	t.buf = append(t.buf[:0], t.buf[n:]...)
	t.dropped = 0
	gone := reason == envd.ReasonExited && len(t.buf) == 0
	if gone {
		out.Exited, out.ExitCode = true, t.status.code
	}
	t.mu.Unlock()
	if gone {
		s.terms.mu.Lock()
		if s.terms.set[t.tag] == t {
			delete(s.terms.set, t.tag)
		}
		s.terms.mu.Unlock()
		_ = t.ptmx.Close()
	}
	return out
}

// closeTerminals closes every terminal's end; Close has killed their programs.
func (s *Server) closeTerminals() {
	s.terms.mu.Lock()
	defer s.terms.mu.Unlock()
	for tag, t := range s.terms.set {
		_ = t.ptmx.Close()
		delete(s.terms.set, tag)
	}
}

// handleTerminals registers the terminal endpoints.
func (s *Server) handleTerminals(m *http.ServeMux) {
	m.Handle("POST "+envd.PathTerminalStart, unary(s.terminalStart))
	m.Handle("POST "+envd.PathTerminalIO, unary(s.terminalIO))
}
