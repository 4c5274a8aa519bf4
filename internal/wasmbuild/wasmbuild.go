// Package wasmbuild builds the built-in plugins the one way the repository keeps them
// (internal/builtins/wasm, embedded by package plugins) and says whether the committed modules are
// in step with their sources. It is used by `make plugins` (go generate ./plugins) and by
// the test that fails when a committed module is stale.
//
// What makes a module stale is a change to what it is built from: the Go files of the
// plugin and of every package of this module it imports, as selected for wasip1, and the
// go directive of go.mod. Their digest is recorded next to the modules (Manifest), so the
// check needs no particular toolchain: the bytes of a build differ between Go patch
// releases, the sources do not. When the toolchain is the one recorded, the test also
// rebuilds and compares the bytes.
package wasmbuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/build"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Module is the module path whose packages count as sources.
const Module = "github.com/toolhost/toolhost"

// ManifestFile is the manifest's name, in the directory of the modules.
const ManifestFile = "manifest.json"

// Flags are the go build flags of every built-in: a reactor module, no file system paths
// of the machine that built it (-trimpath) and no VCS stamp (which would change the bytes
// with every commit).
var Flags = []string{"-trimpath", "-buildvcs=false", "-buildmode=c-shared"}

// Env is the environment of the build, on top of the caller's.
var Env = []string{"GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOWASM=", "GOFLAGS="}

// Manifest records how the committed modules were made.
type Manifest struct {
	// Go is the toolchain that built them (runtime.Version of `make plugins`).
	Go string `json:"go"`
	// Flags are the build flags, for people.
	Flags   string            `json:"flags"`
	Plugins map[string]Record `json:"plugins"`
}

// Record is one plugin's entry: the digest of its sources and of its module.
type Record struct {
	Sources string `json:"sources"`
	Wasm    string `json:"wasm"`
}

// ReadManifest reads dir/manifest.json.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	return m, nil
}

// Write writes m to dir/manifest.json.
func (m Manifest) Write(dir string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644)
}

// Digest is the SHA-256 of b, as "sha256:HEX".
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Sources lists the files a plugin's module is built from, relative to the module root
// (slash-separated, sorted): the Go files of pkg (a directory relative to root, such as
// "plugins/bash") and of every package of this module it imports, selected for
// wasip1/wasm, and go.mod (of which only the go directive counts).
func Sources(root, pkg string) ([]string, error) {
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "wasip1", "wasm", false
	ctx.Dir = root
	seen := map[string]bool{}
	files := []string{"go.mod"}
	var walk func(dir string) error
	walk = func(dir string) error {
		if seen[dir] {
			return nil
		}
		seen[dir] = true
		p, err := ctx.ImportDir(filepath.Join(root, filepath.FromSlash(dir)), 0)
		if err != nil {
			return fmt.Errorf("package %s: %w", dir, err)
		}
		for _, f := range slices.Concat(p.GoFiles, p.EmbedPatterns) {
			files = append(files, dir+"/"+f)
		}
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, Module+"/"); ok {
				if err := walk(rel); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(pkg); err != nil {
		return nil, err
	}
	slices.Sort(files)
	return files, nil
}

// SourceDigest is the digest of a plugin's sources (see Sources): each file's path and
// contents, and of go.mod only its go directive.
func SourceDigest(root, pkg string) (string, error) {
	files, err := Sources(root, pkg)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return "", err
		}
		if f == "go.mod" {
			b = goDirective(b)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// goDirective is the "go 1.N" line of a go.mod file.
func goDirective(gomod []byte) []byte {
	for line := range bytes.Lines(gomod) {
		if f := bytes.Fields(line); len(f) == 2 && string(f[0]) == "go" {
			return bytes.TrimSpace(line)
		}
	}
	return nil
}

// Build compiles the plugin package pkg (relative to root) into out with Flags and Env.
// goTool is the go command (default "go"); stderr receives the compiler's errors.
func Build(goTool, root, pkg, out string, stderr io.Writer) error {
	if goTool == "" {
		goTool = "go"
	}
	args := slices.Concat([]string{"build"}, Flags, []string{"-o", out, "./" + pkg})
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), Env...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.WaitDelay = 10 * time.Second // a compiler child left holding the pipe does not hold Run
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", goTool, strings.Join(args, " "), err)
	}
	return nil
}

// Toolchain is the version of the running toolchain, as the manifest records it.
func Toolchain() string { return runtime.Version() }
