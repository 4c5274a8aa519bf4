package testplugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrNoToolchain is wrapped by BuildRust and BuildAssemblyScript when the machine lacks
// the kit's toolchain (a test skips then, and fails on CI: see internal/testenv).
var ErrNoToolchain = errors.New("toolchain not installed")

// kitBuildBound bounds one cold build of a kit's example (a hang bound, not a budget).
const kitBuildBound = 10 * time.Minute

// kitCache is where the kits' builds are kept across processes, by the digest of what
// they are built from (sources and toolchain): a later run with the same sources runs no
// compiler at all.
func kitCache() string { return filepath.Join(DataDir(), "kits") }

// sourceDigest hashes every file under dir (skipping build output and node_modules) with
// its relative path, and the toolchain's version text.
func sourceDigest(dir, toolchain string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "toolchain %s\n", toolchain)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "target" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:32], err
}

// cached returns the cached build named name of the sources in dir, building it with
// build (which writes the module to the path it is given) when there is none.
func cached(name, dir, toolchain string, build func(out string) error) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	digest, err := sourceDigest(dir, toolchain)
	if err != nil {
		return "", err
	}
	key := name + "-" + digest
	if p, ok := built[key]; ok {
		return p, nil
	}
	out := filepath.Join(kitCache(), key+".wasm")
	if _, err := os.Stat(out); err == nil {
		built[key] = out
		return out, nil
	}
	if err := os.MkdirAll(kitCache(), 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(kitCache(), "."+name+"-*.wasm")
	if err != nil {
		return "", err
	}
	f.Close()
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := build(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, out); err != nil { // atomic: a parallel test process may build it too
		return "", err
	}
	built[key] = out
	return out, nil
}

func run(dir string, env []string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), kitBuildBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.Bytes())
	}
	return nil
}

// output runs a toolchain's query (a version, a target list) and returns its stdout.
func output(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kitBuildBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 10 * time.Second
	return cmd.Output()
}

// RustToolchain finds the Rust compiler and cargo that build the Rust kit, and the name
// of its wasm32 WASI target: Debian's in /usr/bin first (scripts/setup.sh --test installs
// rustc, cargo and libstd-rust-dev-wasm32), whatever rustup put first on PATH, then PATH's.
func RustToolchain() (rustc, cargo, target string, err error) {
	rustc, cargo = "/usr/bin/rustc", "/usr/bin/cargo"
	if _, err := os.Stat(rustc); err != nil {
		if rustc, err = exec.LookPath("rustc"); err != nil {
			return "", "", "", fmt.Errorf("%w: rustc (Debian packages rustc cargo libstd-rust-dev-wasm32; make test installs them)", ErrNoToolchain)
		}
		cargo, _ = exec.LookPath("cargo")
	}
	if _, err := os.Stat(cargo); cargo == "" || err != nil {
		return "", "", "", fmt.Errorf("%w: cargo (Debian package cargo)", ErrNoToolchain)
	}
	list, err := output(rustc, "--print", "target-list")
	if err != nil {
		return "", "", "", fmt.Errorf("%w: %s --print target-list: %v", ErrNoToolchain, rustc, err)
	}
	target = "wasm32-wasi" // rustc 1.63's name; wasm32-wasip1 since 1.78, the old one gone since 1.84
	for _, t := range strings.Fields(string(list)) {
		if t == "wasm32-wasip1" {
			target = t
		}
	}
	sysroot, err := output(rustc, "--print", "sysroot")
	if err != nil {
		return "", "", "", fmt.Errorf("%w: %s --print sysroot: %v", ErrNoToolchain, rustc, err)
	}
	if _, err := os.Stat(filepath.Join(strings.TrimSpace(string(sysroot)), "lib", "rustlib", target, "lib")); err != nil {
		return "", "", "", fmt.Errorf("%w: %s has no standard library for %s (Debian package libstd-rust-dev-wasm32; rustup target add %s)", ErrNoToolchain, rustc, target, target)
	}
	return rustc, cargo, target, nil
}

// BuildRust builds the example of the Rust kit (pdk/rust, `cargo build --release
// --example NAME` for wasm32 WASI) and returns the module's path. Cargo's target
// directory is kept in the shared test data directory, and the module by the digest of
// the kit's sources.
func BuildRust(example string) (string, error) {
	rustc, cargo, target, err := RustToolchain()
	if err != nil {
		return "", err
	}
	version, err := output(rustc, "--version")
	if err != nil {
		return "", fmt.Errorf("%w: %s --version: %v", ErrNoToolchain, rustc, err)
	}
	dir := filepath.Join(Root(), "pdk", "rust")
	return cached("rust-"+example, dir, string(version)+target, func(out string) error {
		targetDir := filepath.Join(kitCache(), "cargo-target")
		if err := run(dir, []string{"RUSTC=" + rustc, "CARGO_TARGET_DIR=" + targetDir}, cargo,
			"build", "--offline", "--quiet", "--release", "--target", target, "--example", example); err != nil {
			return fmt.Errorf("build the Rust kit's example %s: %w", example, err)
		}
		b, err := os.ReadFile(filepath.Join(targetDir, target, "release", "examples", example+".wasm"))
		if err != nil {
			return err
		}
		return os.WriteFile(out, b, 0o644)
	})
}

// AssemblyScriptCompiler is the asc that scripts/setup-assemblyscript.sh installs (make
// test runs it): $TOOLHOST_ASC_DIR, else ~/.cache/toolhost/assemblyscript/VERSION, the
// version pdk/assemblyscript/package.json pins. It returns asc's path and the version.
func AssemblyScriptCompiler() (asc, version string, err error) {
	b, err := os.ReadFile(filepath.Join(Root(), "pdk", "assemblyscript", "package.json"))
	if err != nil {
		return "", "", err
	}
	var pkg struct {
		DevDependencies map[string]string `json:"devDependencies"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		return "", "", fmt.Errorf("pdk/assemblyscript/package.json: %w", err)
	}
	version = pkg.DevDependencies["assemblyscript"]
	dir := os.Getenv("TOOLHOST_ASC_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", "", fmt.Errorf("%w: no home directory for ~/.cache/toolhost/assemblyscript: %v", ErrNoToolchain, err)
		}
		dir = filepath.Join(home, ".cache", "toolhost", "assemblyscript", version)
	}
	asc = filepath.Join(dir, "node_modules", "assemblyscript", "bin", "asc.js")
	if _, err := os.Stat(asc); err != nil {
		return "", "", fmt.Errorf("%w: assemblyscript %s is not in %s (scripts/setup-assemblyscript.sh installs it; make test runs it)", ErrNoToolchain, version, dir)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", "", fmt.Errorf("%w: node (Node.js >= 20; Debian package nodejs)", ErrNoToolchain)
	}
	return asc, version, nil
}

// BuildAssemblyScript builds the example of the AssemblyScript kit
// (pdk/assemblyscript/example/NAME.ts, with the kit's asconfig.json) and returns the
// module's path, kept by the digest of the kit's sources.
func BuildAssemblyScript(example string) (string, error) {
	asc, version, err := AssemblyScriptCompiler()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(Root(), "pdk", "assemblyscript")
	return cached("as-"+example, dir, "assemblyscript "+version, func(out string) error {
		if err := run(dir, nil, "node", asc, "example/"+example+".ts", "--config", "asconfig.json", "--outFile", out); err != nil {
			return fmt.Errorf("build the AssemblyScript kit's example %s: %w", example, err)
		}
		return nil
	})
}
