//go:build linux

package e2bfake

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

// The data plane: envd's protocol on top of the local sandbox's agent.

// proxyError is the edge proxy's JSON error.
func proxyError(w http.ResponseWriter, id string, status int, msg string, port int) {
	body := map[string]any{"sandboxId": id, "message": msg, "code": status}
	if port != 0 {
		body["port"] = port
	}
	writeJSON(w, status, body)
}

// envdError is envd's JSON error of plain HTTP endpoints.
func envdError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// connectError is a unary Connect error.
func connectError(w http.ResponseWriter, code string, msg string) {
	status := map[string]int{"canceled": 499, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
		"already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
		"unimplemented": 501, "unavailable": 503, "unauthenticated": 401}[code]
	if status == 0 {
		status = 500
	}
	writeJSON(w, status, map[string]any{"code": code, "message": msg})
}

// emu serves one request of one sandbox.
type emu struct {
	s     *Server
	sb    *fakeSandbox
	local *local.Sandbox
	agent *http.Client
}

func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int) {
	sb := s.lookup(id)
	var e *emu
	if sb != nil {
		sb.mu.Lock()
		if sb.state == stateRunning && sb.local != nil {
			e = &emu{s: s, sb: sb, local: sb.local, agent: sb.agent}
		}
		sb.mu.Unlock()
	}
	if e == nil {
		proxyError(w, id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	if port != envdPort {
		e.preview(w, r, port)
		return
	}
	e.envd(w, r)
}

func (e *emu) envd(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if p == "/health" && r.Method == http.MethodGet {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if tok := r.Header.Get("X-Access-Token"); e.sb.token != "" && tok != e.sb.token {
		msg := "unauthorized access, please provide a valid access token or method signing if supported"
		if p == "/files" && tok != "" {
			msg = "access token present in header but does not match"
		}
		envdError(w, http.StatusUnauthorized, msg)
		return
	}
	op := "rpc"
	switch {
	case p == "/files":
		op = "files"
	case p == "/process.Process/Start":
		op = "exec"
	}
	if f := e.s.take(op, "envd", e.sb.id); f != nil {
		if f.CutAfter > 0 {
			w = &cutWriter{ResponseWriter: w, left: f.CutAfter}
		} else if e.s.applyFault(w, r, f, func(status int, msg string) {
			if status == http.StatusBadGateway {
				proxyError(w, e.sb.id, status, msg, 0)
				return
			}
			envdError(w, status, msg)
		}) {
			return
		}
	}
	ctx := r.Context()
	switch {
	case p == "/files" && r.Method == http.MethodGet:
		e.download(ctx, w, r)
	case p == "/files" && r.Method == http.MethodPost:
		e.upload(ctx, w, r)
	case r.Method != http.MethodPost && (strings.HasPrefix(p, "/process.Process/") || strings.HasPrefix(p, "/filesystem.Filesystem/")):
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case p == "/process.Process/Start":
		e.start(w, r)
	case p == "/process.Process/SendSignal":
		e.unary(w, r, e.sendSignal)
	case p == "/process.Process/List":
		e.unary(w, r, e.forward(p))
	case p == "/filesystem.Filesystem/Stat":
		e.unary(w, r, e.stat)
	case p == "/filesystem.Filesystem/ListDir":
		e.unary(w, r, e.listDir)
	case p == "/filesystem.Filesystem/MakeDir":
		e.unary(w, r, e.pathCall(p, true))
	case p == "/filesystem.Filesystem/Remove":
		e.unary(w, r, e.pathCall(p, false))
	case strings.HasPrefix(p, "/process.Process/"), strings.HasPrefix(p, "/filesystem.Filesystem/"):
		connectError(w, "unimplemented", p+" is not implemented by this fake")
	default:
		http.NotFound(w, r) // envd's mux: /toolhost/* included
	}
}

// ---- talking to the agent

// errAgentGone: the local sandbox behind went away (killed, vanished).
var errAgentGone = errors.New("the sandbox was not found")

func (e *emu) post(ctx context.Context, proc string, in any) (int, []byte, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sandbox"+proc, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := e.agent.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errAgentGone, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", errAgentGone, err)
	}
	return resp.StatusCode, stripJSON(body), nil
}

// stripJSON removes the agent's toolhost extension fields from a JSON document.
func stripJSON(b []byte) []byte {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return b
	}
	strip(v)
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

func strip(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if strings.HasPrefix(k, "toolhost") {
				delete(t, k)
				continue
			}
			strip(x)
		}
	case []any:
		for _, x := range t {
			strip(x)
		}
	}
}

// lstat describes p as the agent sees it, nil when nothing is there.
func (e *emu) lstat(ctx context.Context, p string) (*envd.EntryInfo, error) {
	status, body, err := e.post(ctx, envd.PathFilesystemStat, envd.PathRequest{Path: p})
	if err != nil {
		return nil, err
	}
	if status == http.StatusNotFound {
		return nil, nil
	}
	if status != http.StatusOK {
		var ce envd.ConnectError
		_ = json.Unmarshal(body, &ce)
		if ce.Code == "not_found" {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %s", p, ce.Message)
	}
	var out envd.EntryResponse
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	return &out.Entry, nil
}

func agentIsLink(e *envd.EntryInfo) bool { return string(e.Type) == envd.FileTypeSymlink }

// realpath resolves the symbolic links in p as the kernel does (the final one too when
// final), up to 40; a component that does not exist ends the walk with the rest appended.
func (e *emu) realpath(ctx context.Context, p string, final bool) (string, error) {
	comps := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	links := 0
	for i := 0; i < len(comps); i++ {
		if comps[i] == "" {
			continue
		}
		next := path.Join(cur, comps[i])
		last := i == len(comps)-1
		if next == "/home" || next == sandbox.WorkspaceRoot {
			cur = next
			continue
		}
		ent, err := e.lstat(ctx, next)
		if err != nil {
			return "", err
		}
		if ent == nil {
			return path.Join(append([]string{next}, comps[i+1:]...)...), nil
		}
		if agentIsLink(ent) && (!last || final) && ent.SymlinkTarget != nil {
			if links++; links > 40 {
				return "", errors.New("too many levels of symbolic links")
			}
			t := *ent.SymlinkTarget
			if !path.IsAbs(t) {
				t = path.Join(cur, t)
			}
			rest := append([]string{path.Clean(t)}, comps[i+1:]...)
			comps = strings.Split(strings.TrimPrefix(path.Join(rest...), "/"), "/")
			cur, i = "/", -1
			continue
		}
		cur = next
	}
	return cur, nil
}

// expand reads a path as envd does: ~ is the home, relative is below it.
func expand(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = sandbox.WorkspaceRoot + p[1:]
	}
	if !path.IsAbs(p) {
		p = path.Join(sandbox.WorkspaceRoot, p)
	}
	return path.Clean(p)
}

// envdEntry describes an entry as envd does: a link by its target's type, fully resolved
// path (its own path when it leads nowhere) and permissions; the type of anything but a
// file, directory or link is unspecified; the mode is the permission bits.
func (e *emu) envdEntry(ctx context.Context, requested, real string, ent *envd.EntryInfo) map[string]any {
	out := map[string]any{"name": ent.Name, "path": requested, "permissions": ent.Permissions, "owner": "user", "group": "user"}
	if ent.ModifiedTime != nil {
		out["modifiedTime"] = ent.ModifiedTime.UTC().Format(time.RFC3339Nano)
	}
	if ent.Size != 0 {
		out["size"] = strconv.FormatInt(int64(ent.Size), 10)
	}
	mode := fs.FileMode(ent.Mode)
	kind := ent
	if agentIsLink(ent) {
		target, err := e.realpath(ctx, real, true)
		t := requested
		kind = nil
		if err == nil {
			if te, err := e.lstat(ctx, target); err == nil && te != nil && !agentIsLink(te) {
				kind, t = te, target
			}
		}
		out["symlinkTarget"] = t
		mode = 0
		if kind != nil {
			mode = fs.FileMode(kind.Mode)
		}
	}
	if perm := uint32(mode.Perm()); perm != 0 {
		out["mode"] = perm
	}
	if kind != nil {
		m := fs.FileMode(kind.Mode)
		switch {
		case string(kind.Type) == envd.FileTypeDir:
			out["type"] = envd.FileTypeDir
		case string(kind.Type) == envd.FileTypeFile && m&fs.ModeType == 0:
			out["type"] = envd.FileTypeFile
		}
	}
	return out
}

// unary serves a Connect unary call: the request must be JSON and not empty.
func (e *emu) unary(w http.ResponseWriter, r *http.Request, fn func(context.Context, []byte) (int, any)) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/json" {
		w.Header().Set("Accept-Post", "application/json, application/proto")
		http.Error(w, "unsupported content type", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		connectError(w, "invalid_argument", "unmarshal into message: empty request")
		return
	}
	status, out := fn(r.Context(), body)
	if errors.Is(asErr(out), errAgentGone) {
		proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	if raw, ok := out.([]byte); ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(raw)
		return
	}
	if ce, ok := out.(*envd.ConnectError); ok {
		connectError(w, ce.Code, ce.Message)
		return
	}
	writeJSON(w, status, out)
}

func asErr(v any) error {
	err, _ := v.(error)
	return err
}

// forward passes a call to the agent as it is (its answer stripped).
func (e *emu) forward(proc string) func(context.Context, []byte) (int, any) {
	return func(ctx context.Context, body []byte) (int, any) {
		var in any
		if err := json.Unmarshal(body, &in); err != nil {
			return 0, &envd.ConnectError{Code: "invalid_argument", Message: err.Error()}
		}
		status, out, err := e.post(ctx, proc, in)
		if err != nil {
			return 0, err
		}
		return status, out
	}
}

func (e *emu) stat(ctx context.Context, body []byte) (int, any) {
	var in envd.PathRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, &envd.ConnectError{Code: "invalid_argument", Message: err.Error()}
	}
	req := expand(in.Path)
	real, err := e.realpath(ctx, req, false)
	if err != nil {
		return 0, errOr(err, "internal")
	}
	ent, err := e.lstat(ctx, real)
	if err != nil {
		return 0, errOr(err, "internal")
	}
	if ent == nil {
		return 0, &envd.ConnectError{Code: "not_found", Message: "file not found: lstat " + req + ": no such file or directory"}
	}
	return http.StatusOK, map[string]any{"entry": e.envdEntry(ctx, req, real, ent)}
}

func errOr(err error, code string) any {
	if errors.Is(err, errAgentGone) {
		return err
	}
	return &envd.ConnectError{Code: code, Message: err.Error()}
}

func (e *emu) listDir(ctx context.Context, body []byte) (int, any) {
	var in struct {
		Path  string `json:"path"`
		Depth uint32 `json:"depth"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, &envd.ConnectError{Code: "invalid_argument", Message: err.Error()}
	}
	req := expand(in.Path)
	real, err := e.realpath(ctx, req, true)
	if err != nil {
		return 0, errOr(err, "internal")
	}
	ent, err := e.lstat(ctx, real)
	switch {
	case err != nil:
		return 0, errOr(err, "internal")
	case ent == nil:
		return 0, &envd.ConnectError{Code: "not_found", Message: "path not found: " + req}
	case string(ent.Type) != envd.FileTypeDir:
		return 0, &envd.ConnectError{Code: "invalid_argument", Message: "path is not a directory: " + req}
	}
	status, out, err := e.post(ctx, envd.PathFilesystemList, map[string]any{"path": real, "depth": max(in.Depth, 1)})
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return status, out
	}
	var lr envd.ListDirResponse
	if err := json.Unmarshal(out, &lr); err != nil {
		return 0, &envd.ConnectError{Code: "internal", Message: err.Error()}
	}
	if lr.ToolhostError != nil { // the agent's walk failed after it began to answer
		return 0, &envd.ConnectError{Code: lr.ToolhostError.Code, Message: lr.ToolhostError.Message}
	}
	entries := []any{}
	for i := range lr.Entries {
		a := lr.Entries[i]
		rel := strings.TrimPrefix(a.Path, real)
		entries = append(entries, e.envdEntry(ctx, req+rel, a.Path, &a))
	}
	return http.StatusOK, map[string]any{"entries": entries}
}

// pathCall forwards MakeDir and Remove with the links before the final component
// resolved (and the final one too for MakeDir, which goes through a link).
func (e *emu) pathCall(proc string, final bool) func(context.Context, []byte) (int, any) {
	return func(ctx context.Context, body []byte) (int, any) {
		var in envd.PathRequest
		if err := json.Unmarshal(body, &in); err != nil {
			return 0, &envd.ConnectError{Code: "invalid_argument", Message: err.Error()}
		}
		req := expand(in.Path)
		real, err := e.realpath(ctx, req, final)
		if err != nil {
			return 0, errOr(err, "internal")
		}
		status, out, err := e.post(ctx, proc, envd.PathRequest{Path: real})
		if err != nil {
			return 0, err
		}
		if status == http.StatusOK && proc == envd.PathFilesystemMkd {
			if ent, err := e.lstat(ctx, real); err == nil && ent != nil {
				return status, map[string]any{"entry": e.envdEntry(ctx, req, real, ent)}
			}
		}
		return status, out
	}
}

// sendSignal signals the one process, as envd does (the agent would signal its group).
func (e *emu) sendSignal(ctx context.Context, body []byte) (int, any) {
	var in envd.SendSignalRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return 0, &envd.ConnectError{Code: "invalid_argument", Message: err.Error()}
	}
	var sig string
	switch in.Signal {
	case envd.SignalKill, "9":
		sig = "KILL"
	case envd.SignalTerm, "15":
		sig = "TERM"
	default:
		return 0, &envd.ConnectError{Code: "unimplemented", Message: fmt.Sprintf("invalid signal: %s", in.Signal)}
	}
	pid, err := e.findProcess(ctx, in.Process)
	if err != nil {
		return 0, errOr(err, "internal")
	}
	if pid == 0 {
		return 0, &envd.ConnectError{Code: "not_found", Message: fmt.Sprintf("process with pid %d not found", in.Process.Pid)}
	}
	if err := e.kill(ctx, pid, sig); err != nil {
		return 0, errOr(err, "internal")
	}
	return http.StatusOK, map[string]any{}
}

func (e *emu) findProcess(ctx context.Context, sel envd.ProcessSelector) (uint32, error) {
	status, body, err := e.post(ctx, envd.PathProcessList, map[string]any{})
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("list processes: HTTP %d", status)
	}
	var lr envd.ListResponse
	if err := json.Unmarshal(body, &lr); err != nil {
		return 0, err
	}
	for _, p := range lr.Processes {
		if (sel.Pid != 0 && p.Pid == sel.Pid) || (sel.Tag != "" && p.Tag == sel.Tag) {
			return p.Pid, nil
		}
	}
	return 0, nil
}

// kill signals one process in the sandbox, from inside it.
func (e *emu) kill(ctx context.Context, pid uint32, sig string) error {
	res, err := e.local.Exec(context.WithoutCancel(ctx), sandbox.ExecRequest{
		Argv:    []string{"/bin/sh", "-c", `kill -s "$1" "$2"`, "sh", sig, strconv.FormatUint(uint64(pid), 10)},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		if errors.Is(err, sandbox.ErrClosed) {
			return fmt.Errorf("%w: %v", errAgentGone, err)
		}
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("kill -s %s %d: %s", sig, pid, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

// ---- /files

func (e *emu) download(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := expand(q.Get("path"))
	real, err := e.realpath(ctx, req, true)
	if err != nil {
		e.filesFailure(w, err)
		return
	}
	ent, err := e.lstat(ctx, real)
	if err != nil {
		e.filesFailure(w, err)
		return
	}
	if ent == nil {
		envdError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", real))
		return
	}
	if string(ent.Type) == envd.FileTypeDir {
		envdError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", real))
		return
	}
	areq, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sandbox/files?"+url.Values{"path": {real}}.Encode(), nil)
	if err != nil {
		envdError(w, http.StatusInternalServerError, err.Error())
		return
	}
	for _, h := range []string{"Range", "If-Modified-Since", "If-None-Match", "If-Range"} {
		if v := r.Header.Get(h); v != "" {
			areq.Header.Set(h, v)
		}
	}
	resp, err := e.agent.Do(areq)
	if err != nil {
		e.filesFailure(w, fmt.Errorf("%w: %v", errAgentGone, err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var fe envd.FilesError
		_ = json.Unmarshal(b, &fe)
		envdError(w, resp.StatusCode, fe.Message)
		return
	}
	for _, h := range []string{"Content-Type", "Content-Length", "Content-Range", "Accept-Ranges", "Last-Modified"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(real)}))
	w.Header().Set("Vary", "Accept-Encoding")
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (e *emu) filesFailure(w http.ResponseWriter, err error) {
	if errors.Is(err, errAgentGone) {
		proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	envdError(w, http.StatusInternalServerError, err.Error())
}

// written is one entry of the upload's answer.
type written struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

func (e *emu) upload(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	q := r.URL.Query()
	var out []written
	switch ct {
	case "application/octet-stream":
		if q.Get("path") == "" {
			envdError(w, http.StatusBadRequest, "path is required for application/octet-stream uploads")
			return
		}
		body := io.Reader(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				envdError(w, http.StatusBadRequest, "invalid gzip body: "+err.Error())
				return
			}
			defer zr.Close()
			body = zr
		}
		wr, status, err := e.put(ctx, q.Get("path"), body)
		if err != nil {
			e.uploadFailure(w, status, err)
			return
		}
		out = append(out, wr)
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			envdError(w, http.StatusBadRequest, "error parsing multipart form: "+err.Error())
			return
		}
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				envdError(w, http.StatusBadRequest, "error reading multipart form: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				continue
			}
			target := q.Get("path")
			if target == "" {
				// envd takes the filename verbatim (a full path); mime/multipart's
				// FileName would keep only its base.
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				target = params["filename"]
			}
			if target == "" {
				envdError(w, http.StatusBadRequest, "no path given for a file part")
				return
			}
			if seen[expand(target)] {
				envdError(w, http.StatusBadRequest, fmt.Sprintf("cannot upload multiple files to same path '%s'", expand(target)))
				return
			}
			seen[expand(target)] = true
			wr, status, err := e.put(ctx, target, part)
			if err != nil {
				e.uploadFailure(w, status, err)
				return
			}
			out = append(out, wr)
		}
	default:
		envdError(w, http.StatusBadRequest, fmt.Sprintf("unsupported content type: %s", ct))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *emu) uploadFailure(w http.ResponseWriter, status int, err error) {
	if errors.Is(err, errAgentGone) {
		proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	if status == 0 {
		status = http.StatusInternalServerError
	}
	envdError(w, status, err.Error())
}

// put writes one file through the agent at the path its links lead to.
func (e *emu) put(ctx context.Context, p string, body io.Reader) (written, int, error) {
	real, err := e.realpath(ctx, expand(p), true)
	if err != nil {
		return written{}, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://sandbox/files?"+url.Values{"path": {real}}.Encode(), body)
	if err != nil {
		return written{}, 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := e.agent.Do(req)
	if err != nil {
		return written{}, 0, fmt.Errorf("%w: %v", errAgentGone, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var fe envd.FilesError
		_ = json.Unmarshal(b, &fe)
		return written{}, resp.StatusCode, errors.New(fe.Message)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return written{Path: real, Name: path.Base(real), Type: "file"}, http.StatusOK, nil
}

// ---- process streams

func readEnv(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > 16<<20 {
		return 0, nil, fmt.Errorf("envelope of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, io.ErrUnexpectedEOF
	}
	return hdr[0], b, nil
}

func envelope(flags byte, payload []byte) []byte {
	b := make([]byte, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	copy(b[5:], payload)
	return b
}

const endStream = 0x02

type frame struct {
	flags   byte
	payload []byte
	err     error
}

// start runs a process through the agent with envd's semantics: the Connect deadline
// kills the started process (only it) and fails the stream with deadline_exceeded;
// keepalive events fill silences; the agent's extensions are not asked for and its
// fields are stripped.
func (e *emu) start(w http.ResponseWriter, r *http.Request) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/connect+json" {
		w.Header().Set("Accept-Post", "application/connect+json, application/connect+proto")
		http.Error(w, "unsupported content type", http.StatusUnsupportedMediaType)
		return
	}
	w.Header().Set("Content-Type", "application/connect+json")
	fail := func(code, msg string) {
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": code, "message": msg}})
		_, _ = w.Write(envelope(endStream, b))
	}
	_, payload, err := readEnv(r.Body)
	if err != nil {
		fail("invalid_argument", "read request: "+err.Error())
		return
	}
	var timeout time.Duration
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || len(v) > 10 {
			fail("invalid_argument", fmt.Sprintf("protocol error: invalid timeout %q", v))
			return
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	keepalive := 90 * time.Second
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		keepalive = time.Duration(v) * time.Second
	}
	var sr envd.StartRequest
	if err := json.Unmarshal(payload, &sr); err != nil {
		fail("invalid_argument", "unmarshal into message: "+err.Error())
		return
	}
	if sr.Process.Cwd != "" {
		sr.Process.Cwd = expand(sr.Process.Cwd)
	}
	b, _ := json.Marshal(sr)

	// Real envd runs the command under context.WithTimeout(context.Background(), timeout):
	// the deadline kills it whether or not the client stayed. So the call to the agent
	// outlives the client when there is a deadline (the handler keeps watching until the
	// command ends or the deadline passes), and without one it ends with the client, the
	// command living on as in envd.
	actx, cancel := context.WithCancel(r.Context())
	if timeout > 0 {
		actx, cancel = context.WithCancel(context.WithoutCancel(r.Context()))
	}
	defer cancel()
	areq, err := http.NewRequestWithContext(actx, http.MethodPost, "http://sandbox"+envd.PathProcessStart, bytes.NewReader(envelope(0, b)))
	if err != nil {
		fail("internal", err.Error())
		return
	}
	areq.Header.Set("Content-Type", "application/connect+json")
	areq.Header.Set("Connect-Protocol-Version", "1")
	resp, err := e.agent.Do(areq)
	if err != nil {
		proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var ce envd.ConnectError
		_ = json.Unmarshal(body, &ce)
		fail(ce.Code, ce.Message)
		return
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(flags byte, p []byte) {
		_, _ = w.Write(envelope(flags, p))
		_ = rc.Flush()
	}

	frames := make(chan frame, 16)
	go func() { // owned by start: ends when the agent's stream ends or actx is cancelled on return
		defer close(frames)
		for {
			flags, p, err := readEnv(resp.Body)
			select {
			case frames <- frame{flags, p, err}:
			case <-actx.Done():
				return
			}
			if err != nil || flags&endStream != 0 {
				return
			}
		}
	}()
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	ka := time.NewTicker(keepalive)
	defer ka.Stop()
	var pid uint32
	clientGone := r.Context().Done()
	for {
		select {
		case <-clientGone:
			if deadline == nil {
				return // the client went: the process lives on, its output is dropped
			}
			// The client went before the deadline: the command still dies at it.
			clientGone, send = nil, func(byte, []byte) {}
		case <-e.s.closing:
			return // the fake closes: it kills every sandbox
		case <-ka.C:
			send(0, []byte(`{"event":{"keepalive":{}}}`))
		case <-deadline:
			if pid == 0 {
				pid, _ = e.findProcess(context.WithoutCancel(r.Context()), envd.ProcessSelector{Tag: sr.Tag})
			}
			if pid != 0 {
				if err := e.kill(context.WithoutCancel(r.Context()), pid, "KILL"); err != nil {
					e.s.log.Debug("e2bfake: kill at the deadline", "pid", pid, "err", err)
				}
			}
			fail("deadline_exceeded", "context deadline exceeded")
			return
		case f, ok := <-frames:
			if !ok {
				return
			}
			if f.err != nil {
				// The agent's stream broke: the sandbox went away under the call.
				return
			}
			p := stripJSON(f.payload)
			if f.flags&endStream == 0 {
				var ev envd.StartResponse
				if json.Unmarshal(p, &ev) == nil && ev.Event.Start != nil {
					pid = ev.Event.Start.Pid
				}
			}
			send(f.flags, p)
			if f.flags&endStream != 0 {
				return
			}
			ka.Reset(keepalive)
		}
	}
}

// ---- previews

func (e *emu) preview(w http.ResponseWriter, r *http.Request, port int) {
	if e.sb.traffic != "" && r.Header.Get("E2b-Traffic-Access-Token") != e.sb.traffic {
		proxyError(w, e.sb.id, http.StatusForbidden, "Sandbox is secured with traffic access token; the token is missing or invalid", port)
		return
	}
	if f := e.s.take("preview", "envd", e.sb.id); f != nil && e.s.applyFault(w, r, f, func(status int, msg string) {
		proxyError(w, e.sb.id, status, msg, port)
	}) {
		return
	}
	u, err := e.local.PreviewURL(r.Context(), port)
	if err != nil {
		if errors.Is(err, sandbox.ErrPortClosed) {
			proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox is running but port is not open", port)
			return
		}
		proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox was not found", 0)
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			for _, h := range []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", "E2b-Traffic-Access-Token"} {
				pr.Out.Header.Del(h)
			}
		},
		ErrorLog: nil,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			proxyError(w, e.sb.id, http.StatusBadGateway, "The sandbox is running but port is not open", port)
		},
	}
	rp.ServeHTTP(w, r)
}
