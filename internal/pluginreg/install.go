package pluginreg

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/toolhost/toolhost"
)

// ErrWidens refuses an upgrade that needs a grant the operator has not accepted; ErrExists
// an add of a plugin already installed; ErrGrants an add without the grants it needs.
var (
	ErrWidens = errors.New("the upgrade needs more grants")
	ErrExists = errors.New("already installed")
	ErrGrants = errors.New("grants not given")
)

// Installer adds, upgrades and verifies the plugins of one configuration file.
type Installer struct {
	// ConfigFile is the configuration file written (made if missing); its lock file is
	// beside it.
	ConfigFile string
	// DataDir holds the pulled modules (CachePath).
	DataDir string
	// Current is the plugins the configuration loads now.
	Current []toolhost.Plugin
	// Keys are the trusted public keys; AllowUnsigned the registries (host[:port]) whose
	// unsigned plugins are accepted.
	Keys          []*ecdsa.PublicKey
	AllowUnsigned []string
	Options       Options
	// Out is where what is pulled and what changes are told.
	Out io.Writer
	// Validate, when set, checks the plugins the configuration would load after the
	// change, before anything is written.
	Validate func(plugins []toolhost.Plugin) error
	// Confirm, when set, asks the operator to accept what an upgrade widens (a terminal's
	// prompt); nil: only the accept argument accepts.
	Confirm func(question string) bool
}

// Fetched is a pulled plugin, verified and inspected.
type Fetched struct {
	*Artifact
	// Actual is what the module is, as inspected here.
	Actual Meta
	Signer string
}

// Fetch pulls the plugin at ref, verifies its signature (or that its registry may serve
// it unsigned) and inspects the module, refusing one whose artifact describes another.
func (in *Installer) Fetch(ctx context.Context, ref string) (*Fetched, error) {
	a, err := Pull(ctx, ref, in.Options)
	if err != nil {
		return nil, err
	}
	f := &Fetched{Artifact: a}
	f.Signer, err = VerifyArtifact(ctx, a, in.Keys, in.Options)
	switch {
	case errors.Is(err, ErrUnsigned) && slices.Contains(in.AllowUnsigned, a.Registry):
		f.Signer = Unsigned
	case errors.Is(err, ErrUnsigned):
		return nil, fmt.Errorf("%w; refused: sign it (toolhost plugin sign), or allow unsigned plugins from %s in registry.allow_unsigned", err, a.Registry)
	case err != nil:
		return nil, err
	}
	f.Actual, err = Describe(ctx, a.Wasm)
	if err != nil {
		return nil, fmt.Errorf("%s: its module: %w", ref, err)
	}
	if err := CheckMeta(a.Meta, f.Actual); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return f, nil
}

func (in *Installer) printf(format string, args ...any) {
	if in.Out != nil {
		fmt.Fprintf(in.Out, format, args...)
	}
}

func (in *Installer) show(f *Fetched) {
	m := f.Actual.Manifest
	in.printf("plugin   %s %s (ABI v%d)\nfrom     %s\ndigest   %s\nsigner   %s\n", m.Name, m.Version, m.ABIVersion, f.Ref, f.Digest, f.Signer)
	in.printf("needs    %s\ntools   ", orNone(capList(f.Actual.Needs)))
	for _, t := range m.Tools {
		in.printf(" %s", t.Name)
	}
	in.printf("\n")
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Add installs the plugin at ref with the grants given, which must cover what it needs:
// its module is kept under DataDir, an entry is added to the configuration and the lock.
// On any failure neither file changes.
func (in *Installer) Add(ctx context.Context, ref string, grants Entry) (*LockedPlugin, error) {
	lockPath := LockPath(in.ConfigFile)
	lock, err := ReadLock(lockPath)
	if err != nil {
		return nil, err
	}
	f, err := in.Fetch(ctx, ref)
	if err != nil {
		return nil, err
	}
	in.show(f)
	name := f.Actual.Manifest.Name
	if old, ok := lock.Find(name); ok {
		return nil, fmt.Errorf("plugin %s is installed (%s from %s): use toolhost plugin upgrade %s: %w", name, old.Version, old.Ref, name, ErrExists)
	}
	var missing []string
	for _, c := range f.Actual.Needs {
		if !slices.Contains(grants.Grants, c) {
			missing = append(missing, "--grant "+string(c))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("plugin %s needs grants not given: accept them with %s (scoped: --grant sandbox_exec=PROGRAM,... --grant sandbox_files.read=GLOB,...): %w",
			name, strings.Join(missing, " "), ErrGrants)
	}
	path, err := CachePut(in.DataDir, f.Wasm)
	if err != nil {
		return nil, err
	}
	grants.Path = path
	if err := in.validate(-1, grants); err != nil {
		return nil, err
	}
	cfg, err := EditConfig(in.ConfigFile, in.Current, "", grants)
	if err != nil {
		return nil, err
	}
	lp := LockedPlugin{Name: name, Version: f.Actual.Manifest.Version, Ref: ref, Digest: f.Digest, Wasm: f.WasmDigest,
		Path: path, Signer: f.Signer, Needs: f.Actual.Needs}
	lock.Put(lp)
	lb, err := lock.Marshal()
	if err != nil {
		return nil, err
	}
	if err := WriteFiles(map[string][]byte{lockPath: lb, in.ConfigFile: cfg}, []string{lockPath, in.ConfigFile}); err != nil {
		return nil, err
	}
	in.printf("added    %s to %s, granted %s\n", name, in.ConfigFile, orNone(capList(grants.Grants)))
	return &lp, nil
}

// validate runs Validate on the current plugins with e in place of the i-th (i < 0: added).
func (in *Installer) validate(i int, e Entry) error {
	if in.Validate == nil {
		return nil
	}
	ps := slices.Clone(in.Current)
	p := toolhost.Plugin{Path: e.Path, Grants: e.Grants}
	if i >= 0 {
		p = ps[i]
		p.Path, p.Grants = e.Path, e.Grants
	}
	p.Exec, p.Files = cmpPtr(e.Exec, p.Exec), cmpPtr(e.Files, p.Files)
	if i >= 0 {
		ps[i] = p
	} else {
		ps = append(ps, p)
	}
	return in.Validate(ps)
}

func cmpPtr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// UpgradeRef is the reference an upgrade of lp to version pulls: lp's repository at that
// tag, or lp's own reference again when version is "".
func UpgradeRef(lp *LockedPlugin, version string) (string, error) {
	if version == "" {
		return lp.Ref, nil
	}
	r, err := ParseRef(lp.Ref)
	if err != nil {
		return "", err
	}
	return r.Context().Name() + ":" + version, nil
}

// Upgrade moves the installed plugin name to version (its repository's tag; "" pulls its
// reference again), showing what changes. A new version that needs a grant the
// configuration does not give it is refused unless accept, and then given the grants
// (scoped as extra says). On any failure neither file changes.
func (in *Installer) Upgrade(ctx context.Context, name, version string, accept bool, extra Entry) ([]Change, error) {
	lockPath := LockPath(in.ConfigFile)
	lock, err := ReadLock(lockPath)
	if err != nil {
		return nil, err
	}
	lp, ok := lock.Find(name)
	if !ok {
		return nil, fmt.Errorf("plugin %s was not installed from a registry (%s lists none by that name): install it with toolhost plugin add REF", name, lockPath)
	}
	i := slices.IndexFunc(in.Current, func(p toolhost.Plugin) bool { return p.Path == lp.Path })
	if i < 0 {
		return nil, fmt.Errorf("plugin %s: the configuration no longer loads %s, which the lock pins", name, lp.Path)
	}
	cur := in.Current[i]
	old, err := os.ReadFile(lp.Path)
	if err != nil {
		return nil, err
	}
	if got := Digest(old); got != lp.Wasm {
		return nil, fmt.Errorf("plugin %s: %s has digest %s, the lock pins %s: %w", name, lp.Path, got, lp.Wasm, ErrLockDiffers)
	}
	oldMeta, err := Describe(ctx, old)
	if err != nil {
		return nil, err
	}
	ref, err := UpgradeRef(lp, version)
	if err != nil {
		return nil, err
	}
	f, err := in.Fetch(ctx, ref)
	if err != nil {
		return nil, err
	}
	if f.Actual.Manifest.Name != name {
		return nil, fmt.Errorf("%s is plugin %s, not %s", ref, f.Actual.Manifest.Name, name)
	}
	in.show(f)
	changes := Diff(oldMeta, f.Actual, cur.Grants)
	if f.Digest == lp.Digest {
		in.printf("plugin %s is at %s already\n", name, f.Digest)
		return nil, nil
	}
	in.printf("changes from %s %s:\n", name, lp.Version)
	var widens []string
	for _, c := range changes {
		mark := "  "
		switch {
		case c.Widens:
			mark = "+ "
			widens = append(widens, c.Text)
		case c.Breaks:
			mark = "! "
		}
		in.printf("  %s%s\n", mark, c.Text)
	}
	if len(changes) == 0 {
		in.printf("    (none the host sees)\n")
	}
	if len(widens) > 0 && !accept && in.Confirm != nil {
		accept = in.Confirm(fmt.Sprintf("accept what plugin %s %s needs more (%s)? [y/N] ", name, f.Actual.Manifest.Version, strings.Join(widens, "; ")))
	}
	if len(widens) > 0 && !accept {
		return changes, fmt.Errorf("plugin %s %s: %s; accept with --accept (scope it with --grant): %w", name, f.Actual.Manifest.Version, strings.Join(widens, "; "), ErrWidens)
	}
	e := EntryOf(cur)
	e.Grants = slices.Clone(cur.Grants)
	for _, c := range f.Actual.Needs {
		if !slices.Contains(e.Grants, c) {
			e.Grants = append(e.Grants, c)
		}
	}
	if extra.Exec != nil {
		e.Exec = extra.Exec
	}
	if extra.Files != nil {
		e.Files = extra.Files
	}
	path, err := CachePut(in.DataDir, f.Wasm)
	if err != nil {
		return nil, err
	}
	e.Path = path
	if err := in.validate(i, e); err != nil {
		return nil, err
	}
	cfg, err := EditConfig(in.ConfigFile, in.Current, lp.Path, e)
	if err != nil {
		return nil, err
	}
	lock.Put(LockedPlugin{Name: name, Version: f.Actual.Manifest.Version, Ref: ref, Digest: f.Digest, Wasm: f.WasmDigest,
		Path: path, Signer: f.Signer, Needs: f.Actual.Needs})
	lb, err := lock.Marshal()
	if err != nil {
		return nil, err
	}
	if err := WriteFiles(map[string][]byte{lockPath: lb, in.ConfigFile: cfg}, []string{lockPath, in.ConfigFile}); err != nil {
		return nil, err
	}
	in.printf("upgraded %s to %s, granted %s\n", name, f.Actual.Manifest.Version, capList(e.Grants))
	return changes, nil
}

// Verify checks each locked plugin: its module file against the lock's digest, and the
// registry's artifact at the locked digest: its module's digest and its signer. It
// returns one problem per line, none when all hold.
func (in *Installer) Verify(ctx context.Context) ([]string, error) {
	lock, err := ReadLock(LockPath(in.ConfigFile))
	if err != nil {
		return nil, err
	}
	var problems []string
	for _, lp := range lock.Plugins {
		if b, err := os.ReadFile(lp.Path); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", lp.Name, err))
		} else if got := Digest(b); got != lp.Wasm {
			problems = append(problems, fmt.Sprintf("%s: %s has digest %s, the lock pins %s", lp.Name, lp.Path, got, lp.Wasm))
		}
		r, err := ParseRef(lp.Ref)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", lp.Name, err))
			continue
		}
		f, err := in.Fetch(ctx, r.Context().Name()+"@"+lp.Digest)
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s: %v", lp.Name, err))
		case f.WasmDigest != lp.Wasm:
			problems = append(problems, fmt.Sprintf("%s: the registry's module has digest %s, the lock pins %s", lp.Name, f.WasmDigest, lp.Wasm))
		case f.Signer != lp.Signer:
			problems = append(problems, fmt.Sprintf("%s: signed by %s, the lock names %s", lp.Name, f.Signer, lp.Signer))
		default:
			in.printf("ok  %s %s %s (signer %s)\n", lp.Name, lp.Version, lp.Digest, lp.Signer)
		}
	}
	return problems, nil
}
