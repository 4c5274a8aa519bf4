package memsandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// server is a preview: what a process of the sandbox serves on a port, reachable from the
// host on a loopback listener.
type server struct {
	addr string // host:port on the host's loopback
	pid  int
	cmd  string
}

// python is `python3 -m http.server [PORT] [--directory DIR] [--bind ADDR]`: the sandbox's
// files under DIR (default: the working directory) over HTTP, until the process ends.
func python(p *proc) int {
	args := p.args[1:]
	if len(args) < 2 || args[0] != "-m" || args[1] != "http.server" {
		fmt.Fprintf(p.stderr, "python3: the memory sandbox runs only python3 -m http.server\n")
		return 2
	}
	port, dir := 8000, p.cwd
	for i := 2; i < len(args); i++ {
		switch a := args[i]; {
		case (a == "--directory" || a == "-d") && i+1 < len(args):
			dir, i = p.abs(args[i+1]), i+1
		case (a == "--bind" || a == "-b") && i+1 < len(args):
			i++
		default:
			n, err := strconv.Atoi(a)
			if err != nil || n < 1 || n > 65535 {
				fmt.Fprintf(p.stderr, "http.server: invalid port %q\n", a)
				return 2
			}
			port = n
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(p.stderr, "OSError: %v\n", err)
		return 1
	}
	s := p.s
	s.mu.Lock()
	if s.ports[port] != nil || s.closed {
		s.mu.Unlock()
		ln.Close()
		fmt.Fprintf(p.stderr, "OSError: [Errno 98] Address already in use\n")
		return 1
	}
	s.pid++
	s.ports[port] = &server{addr: ln.Addr().String(), pid: s.pid, cmd: "python3"}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.ports, port)
		s.mu.Unlock()
	}()
	fmt.Fprintf(p.stderr, "Serving HTTP on 0.0.0.0 port %d (http://0.0.0.0:%d/) ...\n", port, port)
	srv := &http.Server{Handler: http.FileServerFS(treeFS{s: s, root: dir}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }() // owned here: Shutdown below ends it
	select {
	case <-p.ctx.Done():
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(p.stderr, "http.server: %v\n", err)
		}
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		srv.Close()
	}
	<-done
	return -1
}

// treeFS is the sandbox's file tree below root as an fs.FS, read at each Open.
type treeFS struct {
	s    *Sandbox
	root string
}

func (t treeFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	abs := path.Join(t.root, name)
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	p, err := t.s.resolve(abs, true)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
	}
	n := t.s.files[p]
	if n == nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	if n.fifo {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
	}
	f := &treeFile{info: fileInfo{name: path.Base(p), n: *n}}
	if n.dir {
		for _, c := range t.s.below(p) {
			if rel := strings.TrimPrefix(c, p+"/"); !strings.Contains(rel, "/") || p == "/" && strings.Count(c, "/") == 1 {
				f.entries = append(f.entries, fs.FileInfoToDirEntry(fileInfo{name: path.Base(c), n: *t.s.files[c]}))
			}
		}
	} else {
		f.r = bytes.NewReader(bytes.Clone(n.data))
	}
	return f, nil
}

type treeFile struct {
	info    fileInfo
	r       *bytes.Reader
	entries []fs.DirEntry
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *treeFile) Close() error               { return nil }

func (f *treeFile) Read(b []byte) (int, error) {
	if f.r == nil {
		return 0, errors.New("is a directory")
	}
	return f.r.Read(b)
}

func (f *treeFile) Seek(off int64, whence int) (int64, error) {
	if f.r == nil {
		return 0, errors.New("is a directory")
	}
	return f.r.Seek(off, whence)
}

func (f *treeFile) ReadDir(n int) ([]fs.DirEntry, error) {
	if n <= 0 {
		out := f.entries
		f.entries = nil
		return out, nil
	}
	if len(f.entries) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(f.entries))
	out := slices.Clone(f.entries[:n])
	f.entries = f.entries[n:]
	return out, nil
}

type fileInfo struct {
	name string
	n    node
}

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return int64(len(fi.n.data)) }
func (fi fileInfo) ModTime() time.Time { return fi.n.mod }
func (fi fileInfo) IsDir() bool        { return fi.n.dir }
func (fi fileInfo) Sys() any           { return nil }
func (fi fileInfo) Mode() fs.FileMode {
	if fi.n.dir {
		return fs.ModeDir | fi.n.mode
	}
	return fi.n.mode
}
