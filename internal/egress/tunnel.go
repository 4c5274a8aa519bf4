package egress

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// meter is the sandbox's side of one connection: it counts the bytes each way, spends
// them from the session's budget (a read or write past it fails with errBudget), and
// closes the connection, and whatever else joined it, when no byte went either way for
// the idle timeout.
type meter struct {
	net.Conn
	budget *Budget
	idle   time.Duration

	up, down atomic.Int64 // bytes from and to the sandbox
	last     atomic.Int64 // unix nanos of the last byte either way
	cut      atomic.Bool  // the budget ended it
	idled    atomic.Bool  // the idle timeout ended it

	// onCut, while set, is the data phase of a request or tunnel: its bytes spend the
	// budget, and running out calls it (once, before the connection ends, so the
	// refusal is known by the time the client sees the end). Request heads, status lines
	// and refusals spend nothing, so a refusal for the budget can still be said.
	onCut atomic.Pointer[func()]

	mu      sync.Mutex
	timer   *time.Timer
	joined  []io.Closer // closed with the connection on idle (the upstream side)
	stopped bool
}

func newMeter(c net.Conn, b *Budget, idle time.Duration) *meter {
	m := &meter{Conn: c, budget: b, idle: idle}
	m.touch()
	m.timer = time.AfterFunc(idle, m.check)
	return m
}

func (m *meter) touch() { m.last.Store(time.Now().UnixNano()) }

// check runs on the idle timer: it ends the connection, or waits for the rest of the
// idle time since the last byte.
func (m *meter) check() {
	since := time.Since(time.Unix(0, m.last.Load()))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return
	}
	if since < m.idle {
		m.timer.Reset(m.idle - since)
		return
	}
	m.idled.Store(true)
	m.Conn.Close()
	for _, c := range m.joined {
		c.Close()
	}
}

// join makes the idle timeout close c too.
func (m *meter) join(c io.Closer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped || m.idled.Load() {
		c.Close()
		return
	}
	m.joined = append(m.joined, c)
}

// stop ends the idle timer.
func (m *meter) stop() {
	m.mu.Lock()
	m.stopped = true
	m.timer.Stop()
	m.mu.Unlock()
}

// spendFor starts (f set) or ends (nil) a data phase.
func (m *meter) spendFor(f func()) {
	if f == nil {
		m.onCut.Store(nil)
		return
	}
	m.onCut.Store(&f)
}

// spend takes n bytes from the budget in a data phase; it returns how many it had room
// for, having reported the cut when short.
func (m *meter) spend(n int) int {
	f := m.onCut.Load()
	if f == nil {
		return n
	}
	ok := m.budget.take(n)
	if ok < n && !m.cut.Swap(true) {
		(*f)()
	}
	return ok
}

func (m *meter) Read(p []byte) (int, error) {
	if m.cut.Load() {
		return 0, errBudget
	}
	n, err := m.Conn.Read(p)
	if n > 0 {
		m.touch()
		ok := m.spend(n)
		m.up.Add(int64(ok))
		if ok < n {
			return ok, errBudget
		}
	}
	return n, err
}

func (m *meter) Write(p []byte) (int, error) {
	if m.cut.Load() {
		return 0, errBudget
	}
	ok := m.spend(len(p))
	n, err := m.Conn.Write(p[:ok])
	m.down.Add(int64(n))
	if n > 0 {
		m.touch()
	}
	if err == nil && ok < len(p) {
		err = errBudget
	}
	return n, err
}

// ctl writes what the gateway itself says (status lines, refusals, SOCKS replies): counted,
// but never refused for the budget, so a refusal for the budget can be read.
func (m *meter) ctl() io.Writer { return ctlWriter{m} }

type ctlWriter struct{ m *meter }

func (w ctlWriter) Write(p []byte) (int, error) {
	n, err := w.m.Conn.Write(p)
	w.m.down.Add(int64(n))
	return n, err
}

// counts returns the bytes so far, up and down.
func (m *meter) counts() (int64, int64) { return m.up.Load(), m.down.Load() }

// endErr says why a connection ended early, for the audit: the budget or the idle
// timeout, or "".
func (m *meter) endErr() string {
	switch {
	case m.cut.Load():
		return errBudget.Error()
	case m.idled.Load():
		return "idle for " + m.idle.String()
	}
	return ""
}

// splice joins the sandbox (reading through br, which may hold bytes already) and up,
// both ways, until both have ended.
func splice(m *meter, br *bufio.Reader, up net.Conn) {
	done := make(chan struct{})
	go func() { // owned by splice, which waits for it
		defer close(done)
		m.pipeDown(up)
	}()
	m.pipeUp(br, up)
	<-done
	m.Conn.Close()
	up.Close()
}

// copyBufs are the buffers of tunnels; big ones cost fewer system calls on bulk transfers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

type closeWriter interface{ CloseWrite() error }

// onlyReader and onlyWriter hide ReadFrom and WriteTo, so io.CopyBuffer goes through the
// meter's Read and Write, which count.
type onlyReader struct{ io.Reader }
type onlyWriter struct{ io.Writer }

// refusals keeps, per command, the destinations refused to it (each once, in order), for
// the note of the command's result.
type refusals struct {
	mu    sync.Mutex
	byCmd map[string][]Refusal
	order []string // commands, oldest first, to forget the oldest past maxCommands
}

// Refusal is one refused destination, as the model reads it.
type Refusal struct {
	Dest   string // "example.com:443"
	Reason string // the sentence it was told ("egress: ...")
}

const (
	maxRefusalsPerCommand = 32
	maxCommands           = 256
)

func (r *refusals) add(cmd, dest, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byCmd == nil {
		r.byCmd = map[string][]Refusal{}
	}
	list, ok := r.byCmd[cmd]
	if !ok {
		r.order = append(r.order, cmd)
		if len(r.order) > maxCommands {
			delete(r.byCmd, r.order[0])
			r.order = r.order[1:]
		}
	}
	for _, x := range list {
		if x.Dest == dest {
			return
		}
	}
	if len(list) >= maxRefusalsPerCommand {
		return
	}
	r.byCmd[cmd] = append(list, Refusal{Dest: dest, Reason: reason})
}

func (r *refusals) take(cmd string) []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.byCmd[cmd]
	if list == nil {
		return nil
	}
	delete(r.byCmd, cmd)
	for i, c := range r.order {
		if c == cmd {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
	return list
}

// TakeRefusals returns the destinations refused to a command since the last call for it,
// each once, and forgets them.
func (c *Client) TakeRefusals(command string) []Refusal { return c.refused.take(command) }

// Note is the line a tool result ends with when its command was refused destinations:
// "" when none.
func Note(rs []Refusal) string {
	if len(rs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("[egress refused ")
	if len(rs) == 1 {
		b.WriteString("1 destination: ")
	} else {
		b.WriteString(itoa(len(rs)) + " destinations: ")
	}
	for i, r := range rs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(strings.TrimPrefix(r.Reason, "egress: "))
	}
	b.WriteString("]")
	return b.String()
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// Peeking at a TLS ClientHello. The gateway does not terminate TLS in a tunnel (except
// for injected domains): it lets crypto/tls parse the client's first flight far enough to
// hand over the ClientHello, then stops it, and replays every byte read to the upstream
// server. Nothing is written to the client.

// errHelloSeen stops the handshake once the ClientHello is parsed.
var errHelloSeen = errors.New("client hello seen")

// recorder reads from r and keeps a copy of every byte; writes go nowhere.
type recorder struct {
	net.Conn // for deadlines and addresses only
	r        io.Reader
	buf      []byte
}

func (x *recorder) Read(p []byte) (int, error) {
	n, err := x.r.Read(p)
	x.buf = append(x.buf, p[:n]...)
	return n, err
}

func (x *recorder) Write(p []byte) (int, error) { return len(p), nil }

// tlsRecordHandshake is the first byte of a TLS record carrying a handshake message.
const tlsRecordHandshake = 0x16

// peekHello reads the client's ClientHello from br (the bytes stay readable: they are
// returned, to be replayed) and returns its server name. isTLS is false, with nothing
// consumed, when the stream does not start with a TLS handshake record.
func peekHello(br *bufio.Reader, conn net.Conn) (sni string, isTLS bool, consumed []byte, err error) {
	first, err := br.Peek(1)
	if err != nil {
		return "", false, nil, err
	}
	if first[0] != tlsRecordHandshake {
		return "", false, nil, nil
	}
	rec := &recorder{Conn: conn, r: br}
	seen := false
	cfg := &tls.Config{
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = hi.ServerName, true
			return nil, errHelloSeen
		},
	}
	herr := tls.Server(rec, cfg).Handshake()
	if !seen {
		return "", true, rec.buf, errors.Join(errors.New("not a TLS ClientHello"), herr)
	}
	return sni, true, rec.buf, nil
}

// tlsAlert is a fatal TLS alert record, access_denied (49): what a client whose server
// name was refused reads, so it fails at once and clearly instead of waiting.
var tlsAlertAccessDenied = []byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 49}
