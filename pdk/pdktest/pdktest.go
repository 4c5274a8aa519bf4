//go:build unix

// Package pdktest runs a plugin's tools natively under go test, against a pdk.Host backed
// by a temporary directory that stands in for the workspace (/home/user). Commands run as
// ordinary processes in that directory, without a sandbox.
//
//	func TestRead(t *testing.T) {
//		w := pdktest.New(t)
//		w.Write("a.txt", "hello\n")
//		text, isErr := w.Call("read_file", `{"path": "a.txt"}`)
//		...
//	}
package pdktest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/framedinput"
	"github.com/toolhost/toolhost/pdk"
)

// Workspace is the path of the workspace root inside a real sandbox; absolute paths under
// it map to the test directory.
const Workspace = "/home/user"

// Host is a pdk.Host over a directory.
type Host struct {
	t    testing.TB
	Root string // the directory standing in for the workspace
	// OutputCap bounds each captured stream of Exec the way the host does (head and tail
	// kept, the middle counted as cut); 0 means 256 KiB.
	OutputCap int
	// Logs collects what the plugin logged, as "LEVEL msg".
	Logs []string
	// Execs records every exec request.
	Execs []abi.ExecRequest

	mu    sync.Mutex
	procs []*exec.Cmd
}

var serial sync.Mutex // plugin state (buffers, host) is global: one test at a time

// New makes a temporary workspace, routes the pdk host functions to it for the test, and
// restores the previous Host at cleanup. Tests using it must not run in parallel.
func New(t testing.TB) *Host {
	t.Helper()
	serial.Lock()
	h := &Host{t: t, Root: t.TempDir()}
	old := pdk.SetHost(h)
	t.Cleanup(func() {
		pdk.SetHost(old)
		h.mu.Lock()
		for _, c := range h.procs {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
		h.mu.Unlock()
		serial.Unlock()
	})
	return h
}

// Write creates a file in the workspace (and its parent directories).
func (h *Host) Write(name, content string) {
	h.t.Helper()
	p := filepath.Join(h.Root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// Read returns a file of the workspace.
func (h *Host) Read(name string) string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Root, filepath.FromSlash(name)))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// Result calls a tool through pdk.Handle with the input JSON, sent as the host sends it
// (the framed input of ABI.md section 9), and decodes the result strictly, failing the
// test if it is not valid.
func (h *Host) Result(tool, input string) abi.Result {
	h.t.Helper()
	var obj map[string]any
	dec := json.NewDecoder(strings.NewReader(input))
	dec.UseNumber()
	if strings.TrimSpace(input) != "" {
		if err := dec.Decode(&obj); err != nil {
			h.t.Fatalf("bad test input %s: %v", input, err)
		}
	}
	if obj == nil { // absent or null: the host sends an empty object
		obj = map[string]any{}
	}
	req, err := framedinput.Encode(tool, obj)
	if err != nil {
		h.t.Fatalf("bad test input %s: %v", input, err)
	}
	return h.decode(tool, pdk.Handle(req))
}

// ResultJSON is Result with the request sent as JSON, the form hosts before the framed
// input sent and plugins without the kit read.
func (h *Host) ResultJSON(tool, input string) abi.Result {
	h.t.Helper()
	req, err := json.Marshal(map[string]json.RawMessage{"tool": json.RawMessage(strconv.Quote(tool)), "input": json.RawMessage(input)})
	if err != nil {
		h.t.Fatalf("bad test input %s: %v", input, err)
	}
	return h.decode(tool, pdk.Handle(req))
}

func (h *Host) decode(tool string, raw []byte) abi.Result {
	h.t.Helper()
	res, err := DecodeResult(raw)
	if err != nil {
		h.t.Fatalf("result of %s: %v", tool, err)
	}
	return res
}

// DecodeResult decodes a result as the host does: the framed form of ABI.md section 5
// (what pdk returns), or JSON. Invalid UTF-8 in text becomes U+FFFD, images base64.
func DecodeResult(raw []byte) (abi.Result, error) {
	if !bytes.HasPrefix(raw, []byte(abi.FramedMagic)) {
		var res abi.Result
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&res); err != nil {
			return res, fmt.Errorf("result is neither framed nor valid JSON: %v\n%s", err, raw)
		}
		return res, nil
	}
	b := raw[len(abi.FramedMagic):]
	if len(b) == 0 {
		return abi.Result{}, errors.New("framed result without a flags byte")
	}
	res := abi.Result{IsError: b[0]&1 != 0, Content: []abi.Content{}}
	if b[0]&^1 != 0 {
		return res, fmt.Errorf("framed result: unknown flags %#x", b[0])
	}
	b = b[1:]
	data := func() ([]byte, error) {
		if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) > len(b)-4 {
			return nil, fmt.Errorf("framed result: block %d is cut short", len(res.Content))
		}
		n := int(binary.LittleEndian.Uint32(b))
		d := b[4 : 4+n]
		b = b[4+n:]
		return d, nil
	}
	for len(b) > 0 {
		kind := b[0]
		b = b[1:]
		switch kind {
		case 't':
			d, err := data()
			if err != nil {
				return res, err
			}
			res.Content = append(res.Content, abi.Content{Type: abi.ContentText, Text: strings.ToValidUTF8(string(d), "\uFFFD")})
		case 'i':
			if len(b) < 1 || int(b[0]) > len(b)-1 {
				return res, fmt.Errorf("framed result: block %d: media type cut short", len(res.Content))
			}
			mt := string(b[1 : 1+int(b[0])])
			b = b[1+int(b[0]):]
			d, err := data()
			if err != nil {
				return res, err
			}
			res.Content = append(res.Content, abi.Content{Type: abi.ContentImage, Source: &abi.ImageSource{
				Type: "base64", MediaType: mt, Data: base64.StdEncoding.EncodeToString(d)}})
		case 's':
			d, err := data()
			if err != nil {
				return res, err
			}
			if res.Structured != nil {
				return res, errors.New("framed result: two structured results")
			}
			if !json.Valid(d) {
				return res, fmt.Errorf("framed result: the structured result is not valid JSON: %s", d)
			}
			res.Structured = abi.RawJSON(append([]byte{}, d...))
		default:
			return res, fmt.Errorf("framed result: block %d: unknown kind %q", len(res.Content), kind)
		}
	}
	return res, nil
}

// Call calls a tool and returns the text of its result and whether it is an error.
func (h *Host) Call(tool, input string) (text string, isError bool) {
	h.t.Helper()
	res := h.Result(tool, input)
	var sb strings.Builder
	for _, c := range res.Content {
		sb.WriteString(c.Text)
	}
	return sb.String(), res.IsError
}

func fail(op string, s abi.Status, p string, reason string) error {
	return &pdk.Error{Op: op, Status: s, Msg: op + " " + p + ": " + reason}
}

// resolve maps a workspace path to a name relative to Root, refusing what leaves it.
func (h *Host) resolve(op, p string) (string, error) {
	if p == Workspace || strings.HasPrefix(p, Workspace+"/") {
		p = strings.TrimPrefix(strings.TrimPrefix(p, Workspace), "/")
	}
	if path.IsAbs(p) {
		return "", fail(op, abi.StatusOutside, p, "path is outside the workspace")
	}
	c := path.Clean("/" + p)[1:]
	if c == "" {
		c = "."
	}
	if !filepath.IsLocal(filepath.FromSlash(p)) && c != "." {
		return "", fail(op, abi.StatusOutside, p, "path is outside the workspace")
	}
	return c, nil
}

func mapErr(op, p string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fail(op, abi.StatusNotFound, p, "no such file or directory")
	case errors.Is(err, syscall.EISDIR):
		return fail(op, abi.StatusIsDir, p, "is a directory")
	case errors.Is(err, syscall.ENOTDIR):
		return fail(op, abi.StatusNotDir, p, "not a directory")
	case errors.Is(err, fs.ErrPermission):
		return fail(op, abi.StatusPermission, p, "permission denied")
	case strings.Contains(err.Error(), "escapes"): // codecheck:errtext os.Root's "path escapes from parent": os keeps its sentinel unexported
		return fail(op, abi.StatusOutside, p, "path is outside the workspace")
	}
	return fail(op, abi.StatusIO, p, err.Error())
}

func (h *Host) root() *os.Root {
	r, err := os.OpenRoot(h.Root)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// ReadFile implements pdk.Host.
func (h *Host) ReadFile(p string) ([]byte, error) {
	name, err := h.resolve("read", p)
	if err != nil {
		return nil, err
	}
	r := h.root()
	defer r.Close()
	if fi, err := r.Stat(name); err == nil && fi.IsDir() {
		return nil, fail("read", abi.StatusIsDir, p, "is a directory")
	}
	b, err := r.ReadFile(name)
	if err != nil {
		return nil, mapErr("read", p, err)
	}
	return b, nil
}

// WriteFile implements pdk.Host.
func (h *Host) WriteFile(p string, data []byte) error {
	name, err := h.resolve("write", p)
	if err != nil {
		return err
	}
	r := h.root()
	defer r.Close()
	if fi, err := r.Stat(name); err == nil && fi.IsDir() {
		return fail("write", abi.StatusIsDir, p, "is a directory")
	}
	if dir := path.Dir(name); dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return mapErr("write", p, err)
		}
	}
	if err := r.WriteFile(name, data, 0o644); err != nil {
		return mapErr("write", p, err)
	}
	return nil
}

// Remove implements pdk.RemoveHost: it removes a file or a symbolic link, never a
// directory.
func (h *Host) Remove(p string) error {
	rel, err := h.resolve("remove", p)
	if err != nil {
		return err
	}
	fi, err := h.root().Lstat(rel)
	if err != nil {
		return mapErr("remove", p, err)
	}
	if fi.IsDir() {
		return fail("remove", abi.StatusIsDir, p, "is a directory")
	}
	if err := h.root().Remove(rel); err != nil {
		return mapErr("remove", p, err)
	}
	return nil
}

func info(p string, fi fs.FileInfo) abi.FileInfo {
	t := abi.TypeOther
	switch {
	case fi.Mode().IsRegular():
		t = abi.TypeFile
	case fi.IsDir():
		t = abi.TypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		t = abi.TypeSymlink
	}
	return abi.FileInfo{Path: p, Type: t, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), ModTime: fi.ModTime().UnixMilli()}
}

// Stat implements pdk.Host.
func (h *Host) Stat(p string) (abi.FileInfo, error) {
	name, err := h.resolve("stat", p)
	if err != nil {
		return abi.FileInfo{}, err
	}
	r := h.root()
	defer r.Close()
	fi, err := r.Lstat(name)
	if err != nil {
		return abi.FileInfo{}, mapErr("stat", p, err)
	}
	return info(p, fi), nil
}

// List implements pdk.Host.
func (h *Host) List(req abi.ListRequest) (abi.ListResult, error) {
	name, err := h.resolve("list", req.Path)
	if err != nil {
		return abi.ListResult{}, err
	}
	base := filepath.Join(h.Root, filepath.FromSlash(name))
	fi, err := os.Lstat(base)
	if err != nil {
		return abi.ListResult{}, mapErr("list", req.Path, err)
	}
	if !fi.IsDir() {
		return abi.ListResult{}, fail("list", abi.StatusNotDir, req.Path, "not a directory")
	}
	var res abi.ListResult
	err = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == base {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		rel = filepath.ToSlash(rel)
		if req.Limit > 0 && len(res.Entries) >= req.Limit {
			res.Truncated = true
			return filepath.SkipAll
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		res.Entries = append(res.Entries, info(rel, fi))
		if d.IsDir() && (!req.Recursive || contains(req.Skip, d.Name())) {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return abi.ListResult{}, mapErr("list", req.Path, err)
	}
	sort.Slice(res.Entries, func(i, j int) bool { return res.Entries[i].Path < res.Entries[j].Path })
	return res, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Log implements pdk.Host.
func (h *Host) Log(level int32, msg string) {
	h.Logs = append(h.Logs, strconv.Itoa(int(level))+" "+msg)
}

// capture keeps the head and tail of a stream within max bytes, counting the rest.
type capture struct {
	max        int
	head, tail []byte
	cut        int64
}

func (c *capture) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max/2 - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	c.tail = append(c.tail, p...)
	if over := len(c.tail) - (c.max - c.max/2); over > 0 {
		c.cut += int64(over)
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	return n, nil
}

func (c *capture) String() string { return string(c.head) + string(c.tail) }

// Exec implements pdk.Host: it runs argv directly (no shell) with the workspace as the
// working directory, killing the process group on timeout (default 60 s).
func (h *Host) Exec(req abi.ExecRequest) (abi.ExecResult, error) {
	h.Execs = append(h.Execs, req)
	if len(req.Argv) == 0 {
		return abi.ExecResult{}, &pdk.Error{Op: "exec", Status: abi.StatusInvalid, Msg: "exec: empty argv"}
	}
	dir, err := h.resolve("exec", req.Cwd)
	if err != nil {
		return abi.ExecResult{}, err
	}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Dir = filepath.Join(h.Root, filepath.FromSlash(dir))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second // a grandchild holding the output pipes does not hold Wait
	cmd.Env = os.Environ()
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if req.Background {
		log, err := os.CreateTemp("", "pdktest-bg-*.log")
		if err != nil {
			return abi.ExecResult{}, err
		}
		h.t.Cleanup(func() { os.Remove(log.Name()) })
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			log.Close()
			return abi.ExecResult{ExitCode: 127, Stderr: err.Error()}, nil
		}
		log.Close()
		h.mu.Lock()
		h.procs = append(h.procs, cmd)
		h.mu.Unlock()
		return abi.ExecResult{ID: "bg-" + strconv.Itoa(len(h.procs)), PID: cmd.Process.Pid, LogPath: log.Name()}, nil
	}
	limit := h.OutputCap
	if limit <= 0 {
		limit = 256 << 10
	}
	stdout, stderr := &capture{max: limit}, &capture{max: limit}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return abi.ExecResult{ExitCode: 127, Stderr: err.Error()}, nil
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var timedOut bool
	select {
	case err = <-done:
	case <-ctx.Done():
		timedOut = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = <-done
	}
	res := abi.ExecResult{
		Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutCut: stdout.cut, StderrCut: stderr.cut,
		TimedOut: timedOut, DurationMS: time.Since(start).Milliseconds(),
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode() // -1 when killed by a signal
	default:
		return abi.ExecResult{}, err
	}
	return res, nil
}
