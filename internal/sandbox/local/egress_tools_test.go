//go:build linux

package local

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolhost/toolhost/internal/egress"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The package managers a coding agent runs, unchanged, from inside a real sandbox through
// the gateway, against registries the test serves on its own internet (HTTPS with the
// test CA, which the sandbox is told to trust): npm with a package and its dependency,
// pip from a simple index, git clone over smart HTTP.

func needTool(t *testing.T, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		testenv.Skipf(t, "%s is not installed (Debian package %s; scripts/setup.sh --test installs it)", path, pkg)
	}
}

// registry serves npm, pip and git on registry.test:443.
func serveRegistries(t *testing.T, e *egressNet) {
	t.Helper()
	mux := http.NewServeMux()
	serveNPM(t, mux)
	servePyPI(t, mux)
	serveGit(t, mux)
	l, err := e.n.Listen("tcp", netip.AddrPortFrom(e.reg, 8443).String())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.n.ServeTLS(l, mux, "registry.test"); err != nil {
		t.Fatal(err)
	}
}

// npmTarball packs a package as npm publishes it: package/ at the root of a tar.gz.
func npmTarball(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: "package/" + name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

func serveNPM(t *testing.T, mux *http.ServeMux) {
	const base = "https://registry.test:8443/npm/"
	pkgs := []struct {
		name, main string
		deps       map[string]string
	}{
		{"left-pad-test", `module.exports = (s, n) => String(s).padStart(n);`, nil},
		{"greeter-test", `const pad = require("left-pad-test"); module.exports = (who) => "hello " + pad(who, 8);`, map[string]string{"left-pad-test": "^1.0.0"}},
	}
	for _, p := range pkgs {
		manifest := map[string]any{"name": p.name, "version": "1.0.0", "main": "index.js", "license": "MIT"}
		if p.deps != nil {
			manifest["dependencies"] = p.deps
		}
		mj, _ := json.Marshal(manifest)
		tgz := npmTarball(t, map[string]string{"package.json": string(mj), "index.js": p.main})
		s1 := sha1.Sum(tgz)
		s512 := sha512.Sum512(tgz)
		version := map[string]any{}
		for k, v := range manifest {
			version[k] = v
		}
		tarballPath := p.name + "/-/" + p.name + "-1.0.0.tgz"
		version["dist"] = map[string]any{
			"tarball":   base + tarballPath,
			"shasum":    hex.EncodeToString(s1[:]),
			"integrity": "sha512-" + base64.StdEncoding.EncodeToString(s512[:]),
		}
		packument, _ := json.Marshal(map[string]any{
			"name": p.name, "dist-tags": map[string]string{"latest": "1.0.0"},
			"versions": map[string]any{"1.0.0": version},
		})
		mux.HandleFunc("GET /npm/"+p.name, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(packument)
		})
		mux.HandleFunc("GET /npm/"+tarballPath, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(tgz)
		})
	}
}

// wheel builds a pure-Python wheel.
func wheel(t *testing.T, name, version, code string, requires ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	info := name + "-" + version + ".dist-info/"
	meta := "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
	for _, r := range requires {
		meta += "Requires-Dist: " + r + "\n"
	}
	files := [][2]string{
		{name + "/__init__.py", code},
		{info + "METADATA", meta},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: toolhost-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		w, _ := zw.Create(f[0])
		w.Write([]byte(f[1]))
		sum := sha256.Sum256([]byte(f[1]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f[0], base64.RawURLEncoding.EncodeToString(sum[:]), len(f[1]))
	}
	record.WriteString(info + "RECORD,,\n")
	w, _ := zw.Create(info + "RECORD")
	w.Write([]byte(record.String()))
	zw.Close()
	return buf.Bytes()
}

func servePyPI(t *testing.T, mux *http.ServeMux) {
	for _, p := range []struct {
		name, code string
		requires   []string
	}{
		{"tinyvalue", "VALUE = 41\n", nil},
		{"answerpkg", "import tinyvalue\nANSWER = tinyvalue.VALUE + 1\n", []string{"tinyvalue"}},
	} {
		whl := wheel(t, p.name, "1.0", p.code, p.requires...)
		file := p.name + "-1.0-py3-none-any.whl"
		sum := sha256.Sum256(whl)
		page := fmt.Sprintf("<!DOCTYPE html><html><body><a href=\"/files/%s#sha256=%s\">%s</a></body></html>", file, hex.EncodeToString(sum[:]), file)
		mux.HandleFunc("GET /simple/"+p.name+"/", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte(page))
		})
		mux.HandleFunc("GET /files/"+file, func(w http.ResponseWriter, r *http.Request) { w.Write(whl) })
	}
}

// serveGit serves a bare repository with one commit over git's smart HTTP protocol.
func serveGit(t *testing.T, mux *http.ServeMux) {
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		return // TestEgressGitClone skips
	}
	root := t.TempDir()
	work := filepath.Join(root, "work")
	gitRun := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	os.MkdirAll(work, 0o755)
	gitRun(work, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(work, "README"), []byte("cloned through the gateway\n"), 0o644)
	gitRun(work, "add", "README")
	gitRun(work, "commit", "-q", "-m", "first")
	gitRun(root, "clone", "-q", "--bare", work, "repo.git")
	mux.Handle("/git/", &cgi.Handler{
		Path: backend,
		Root: "/git",
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1"},
	})
}

func toolSandbox(t *testing.T) (*egressNet, *Sandbox) {
	e := newEgressNet(t)
	serveRegistries(t, e)
	p := newProvider(t, Config{})
	_, opts := e.session(t, egress.Spec{Allow: []string{"registry.test:8443"}}, egress.SessionConfig{})
	return e, newSandbox(t, p, opts)
}

func TestEgressNPMInstall(t *testing.T) {
	needTool(t, "/usr/bin/npm", "npm")
	e, sb := toolSandbox(t)
	res := run(t, sb, "npm-install", `set -e
mkdir app && cd app && echo '{"name":"app","version":"1.0.0"}' > package.json
npm install --registry https://registry.test:8443/npm/ --no-audit --no-fund --no-update-notifier greeter-test 2>&1
node -e 'console.log(require("greeter-test")("world"))'
ls node_modules`)
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "hello    world") || !strings.Contains(string(res.Stdout), "left-pad-test") {
		t.Fatalf("npm install: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	e.waitRecord(t, "npm's tunnel", func(r egress.Record) bool {
		return r.Command == "npm-install" && r.Name == "registry.test" && r.Port == 8443
	})
}

func TestEgressPipInstall(t *testing.T) {
	needTool(t, "/usr/lib/python3/dist-packages/pip", "python3-pip")
	e, sb := toolSandbox(t)
	res := run(t, sb, "pip-install", `set -e
python3 -m pip install --no-cache-dir --disable-pip-version-check --target /home/user/pylib --index-url https://registry.test:8443/simple/ answerpkg 2>&1
PYTHONPATH=/home/user/pylib python3 -c 'import answerpkg; print("answer", answerpkg.ANSWER)'`)
	if res.ExitCode != 0 || !strings.Contains(string(res.Stdout), "answer 42") {
		t.Fatalf("pip install: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	e.waitRecord(t, "pip's tunnel", func(r egress.Record) bool { return r.Command == "pip-install" && r.Name == "registry.test" })
}

func TestEgressGitClone(t *testing.T) {
	needTool(t, "/usr/lib/git-core/git-http-backend", "git")
	e, sb := toolSandbox(t)
	res := run(t, sb, "git-clone", `set -e
git clone -q https://registry.test:8443/git/repo.git 2>&1
cat repo/README`)
	if res.ExitCode != 0 || string(res.Stdout) != "cloned through the gateway\n" {
		t.Fatalf("git clone: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	e.waitRecord(t, "git's tunnel", func(r egress.Record) bool { return r.Command == "git-clone" && r.Name == "registry.test" })
}
