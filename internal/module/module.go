// Package module is the registry of toolhost's modules: the sandbox providers and the
// object stores, the built-in ones and any that a program embedding toolhost adds. The
// root package re-exports its types (toolhost.ProviderModule, toolhost.StoreModule, ...)
// and its Register functions; the built-in modules register here from their own
// packages' init functions, which package modules/standard imports (the root package
// registers none: a program links the modules it imports).
//
// A module is one value that says everything toolhost needs to know about it, so that
// adding one is a folder and an import line (Caddy's module system is the model):
//
//   - its name (the value of sandbox.provider, or of store.kind);
//   - its configuration: the keys it owns, with their docs (the key table, the CLI's flags
//     and variables, toolhost.example.yaml and docs/CONFIG.md are assembled from every
//     module's), and a function that returns its defaults as a *C, the module's own
//     struct whose fields carry `key` tags (Provider[C], Store[C]: every function of the
//     module takes that *C, so none converts its configuration);
//   - Validate, which checks its configuration; the error names the key;
//   - New or Open, which makes the provider or opens the store;
//   - Doctor, which checks on this machine what the module needs (optional).
//
// The lifecycle, in order: Config (defaults) once per toolhost.Config, then the
// configuration is filled (a file, variables, flags, or a program's Set calls), then
// Validate (toolhost.Config.Validate, before anything is made), then New / Open when a
// Toolhost first needs the provider or the store, and the provider's or store's own Close
// (sandbox.Closer, or the Close the store module returns) when the Toolhost closes.
package module

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/core/store"
)

// Key documents one configuration key of a module.
type Key struct {
	// Name is the whole dotted name, as a file writes it: "e2b.api_key". It lies below the
	// module's Prefix, and the part after the prefix is the `key` tag path of its field in
	// the module's configuration struct ("api_key").
	Name string
	// Flag is the CLI flag that sets it, without dashes ("e2b-domain"); empty for keys only
	// a file sets (lists of mappings, mappings) and for secrets.
	Flag string
	// Secret: a credential. It gets a variable but no flag (a command line is visible to
	// every user of the machine), and its field is a Secret, which never prints.
	Secret bool
	// FileOnly: set only in a file (a list of mappings, a mapping): no variable, no flag.
	FileOnly bool
	// Default is how the default reads when it depends on the machine or on another key
	// (`"" ($E2B_API_KEY)`); empty means the value the module's Config returns.
	Default string
	// Usage is one line: the flag's help.
	Usage string
	// Doc says what the key does, in full.
	Doc string
	// Aliases are older whole names of the key, still accepted.
	Aliases []string
	// Example is an example of the value, as YAML lines the example file shows commented
	// out below the key (for the keys only a file sets).
	Example string
	// HostPath: the key's value is a path on the host that the host reads or writes on its
	// own behalf (a store's directory, a socket directory). A workspace that contains it is
	// refused: a sandbox could rewrite it.
	HostPath bool
}

// Section documents a section of keys, for the example file and the reference.
type Section struct {
	// Name is the dotted section ("e2b", "store.s3").
	Name string
	// Doc is a paragraph about it; empty for a section that needs none.
	Doc string
}

// Env is what a module is made with, beside its own configuration.
type Env struct {
	// Logger receives the module's records.
	Logger *slog.Logger
	// DataDir is the host's data directory (data_dir): a module keeps its host state in a
	// directory of its own name below it.
	DataDir string
	// Store is the configured object store, for a provider that keeps records in it (E2B's
	// quota ledger); nil for a store module itself, and in Doctor when the store could not
	// be opened.
	Store store.Store
	// StoreShared says whether Store may be shared by several hosts (an S3 bucket), so
	// records that hosts add up belong in it rather than in DataDir.
	StoreShared bool
	// Settings are the other keys a module may honour or check against.
	Settings Settings
}

// Settings are the keys outside a module's own that providers honour: the sandbox policy
// every provider enforces as far as it can (and says how, or that it cannot), and the
// session's lifetime.
type Settings struct {
	// Providers are the providers sandbox.provider names, in order; StoreKind is store.kind.
	// Every module's configuration is validated, whether or not it is chosen (a bad value
	// is a mistake either way); what matters only for a chosen module is checked when it
	// is.
	Providers []string
	StoreKind string
	// Network is sandbox.network: "egress", "none" or "host".
	Network string
	// Limits of each sandbox, from sandbox.*: -1 means no limit.
	MemoryBytes, Processes, TmpBytes, ShmBytes, DiskBytes, OpenFiles int64
	// CPUs is the CPU quota in cores; 0 means all.
	CPUs float64
	// TTL is session.ttl: how long a sandbox lives unless extended (CreateOptions.Timeout
	// when zero).
	TTL time.Duration
	// MaxLifetime is session.max_lifetime: the longest a session keeps one sandbox.
	MaxLifetime time.Duration
	// KeepaliveMargin is session.keepalive_margin: a sandbox is extended or replaced when
	// less than this is left, so a provider with a lifetime bound must allow more.
	KeepaliveMargin time.Duration
	// Pool is sandbox.pool: how many started sandboxes a provider that keeps spares keeps
	// ready (the local provider's spares, the kubernetes provider's warm pool); 0: none.
	Pool int
}

// Provider is a sandbox provider module whose configuration is a C: a struct whose
// fields carry `key` tags that name the keys below Prefix (a nested struct for a deeper
// section). Each function takes the module's own *C, so a module never converts its
// configuration; a module without keys may use struct{}.
type Provider[C any] struct {
	// Name is the value of sandbox.provider that chooses it ("local", "e2b"): letters,
	// digits, '-' and '_'.
	Name string
	// Prefix is where its keys live ("e2b."), with the dot; empty when it has none.
	Prefix string
	// Sections document the sections its keys open (may be empty).
	Sections []Section
	// Keys are its configuration keys, in the order the reference shows them.
	Keys []Key
	// Config returns its configuration with the defaults. Required with Keys; nil when
	// it has none (the functions below then get a zero C).
	Config func() *C
	// Validate checks the configuration (what Config returned, filled), against the
	// settings when it must; the error names the key and fits on one line. Called for
	// every registered provider (Settings.Providers says whether it is chosen). Nil:
	// nothing to check.
	Validate func(cfg *C, s Settings) error
	// New makes the provider. A provider that cannot mount host directories refuses
	// CreateOptions.Workspace (an error wrapping sandbox.ErrUnsupported); one whose
	// sandboxes cannot live past a bound says so with sandbox.LifetimeBound; one that must
	// be closed implements sandbox.Closer.
	New func(ctx context.Context, cfg *C, env Env) (sandbox.Provider, error)
	// Doctor checks what the provider needs on this machine, each part for real; called by
	// toolhost doctor when sandbox.provider names it. alone says whether it is the only
	// provider named (a failure then is fatal rather than a warning). Nil: no checks.
	Doctor func(ctx context.Context, cfg *C, env Env, alone bool) []Check
}

// Store is an object store module whose configuration is a C (see Provider).
type Store[C any] struct {
	// Kind is the value of store.kind that chooses it ("dir", "s3").
	Kind     string
	Prefix   string
	Sections []Section
	Keys     []Key
	Config   func() *C
	// Validate checks the configuration, for every registered store (Settings.StoreKind
	// says whether it is chosen).
	Validate func(cfg *C, s Settings) error
	// Open opens the store.
	Open func(ctx context.Context, cfg *C, env Env) (Opened, error)
}

// Registered is a registered module as the configuration and the host see it, whatever
// its configuration's type: its names and keys, and its functions over a configuration
// that NewConfig made (the module's own *C, which a decoder fills by its key tags).
type Registered struct {
	Name     string // the provider's name, or the store's kind
	Prefix   string
	Sections []Section
	Keys     []Key

	newConfig func() any
	validate  func(cfg any, s Settings) error
	newP      func(ctx context.Context, cfg any, env Env) (sandbox.Provider, error)
	doctor    func(ctx context.Context, cfg any, env Env, alone bool) []Check
	open      func(ctx context.Context, cfg any, env Env) (Opened, error)
}

// HasConfig says whether the module has keys, so a configuration of its own.
func (r Registered) HasConfig() bool { return r.newConfig != nil }

// NewConfig is the module's configuration with its defaults (a *C), or nil when it has
// no keys.
func (r Registered) NewConfig() any {
	if r.newConfig == nil {
		return nil
	}
	return r.newConfig()
}

// Validate runs the module's Validate on cfg, a value NewConfig made (or nil).
func (r Registered) Validate(cfg any, s Settings) error { return r.validate(cfg, s) }

// New makes a provider module's provider from cfg.
func (r Registered) New(ctx context.Context, cfg any, env Env) (sandbox.Provider, error) {
	return r.newP(ctx, cfg, env)
}

// Doctor runs a provider module's checks with cfg; none when it has no Doctor.
func (r Registered) Doctor(ctx context.Context, cfg any, env Env, alone bool) []Check {
	if r.doctor == nil {
		return nil
	}
	return r.doctor(ctx, cfg, env, alone)
}

// Open opens a store module's store from cfg.
func (r Registered) Open(ctx context.Context, cfg any, env Env) (Opened, error) {
	return r.open(ctx, cfg, env)
}

// configOf is cfg as the module's own *C: the value its Config made, or a zero C for a
// module without keys (or a configuration that has none of its values yet). The one place
// the erased value meets its type again: a Registered only ever gets back what its own
// NewConfig made.
func configOf[C any](config func() *C, cfg any) *C {
	if c, ok := cfg.(*C); ok && c != nil {
		return c
	}
	if config != nil {
		return config()
	}
	return new(C)
}

// erase is the Registered form of a module's configuration functions.
func erase[C any](config func() *C, validate func(*C, Settings) error) (func() any, func(any, Settings) error) {
	var newConfig func() any
	if config != nil {
		newConfig = func() any { return config() }
	}
	v := func(cfg any, s Settings) error {
		if validate == nil {
			return nil
		}
		return validate(configOf(config, cfg), s)
	}
	return newConfig, v
}

// Opened is a store a Store module opened.
type Opened struct {
	Store store.Store
	// Where names it for people: a directory, s3://BUCKET.
	Where string
	// Shared: several hosts may use it at once (see Env.StoreShared).
	Shared bool
	// Close releases it; nil when there is nothing to release.
	Close func() error
}

// Check is one finding of toolhost doctor.
type Check struct {
	// Name is the part: "plugins", "sandbox", "limits", "python3", "browser", "store",
	// "lease", "e2b".
	Name string
	// OK: usable.
	OK bool
	// Needed: the configuration cannot work without it (doctor exits non-zero when a
	// needed check is not OK); otherwise a failure is a warning.
	Needed bool
	// Detail is what was found when OK, what to do otherwise. One line.
	Detail string
}

// Secret is a configuration value that is a credential. It never shows: fmt, slog and
// text encoders see "[redacted]" (or "" when it is empty), so a logged or dumped
// configuration cannot leak it; string(s) is the value.
type Secret string

func (s Secret) redacted() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// String is "[redacted]", or "" when s is empty.
func (s Secret) String() string { return s.redacted() }

// GoString is what %#v shows.
func (s Secret) GoString() string { return strconv.Quote(s.redacted()) }

// LogValue is what slog records.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.redacted()) }

// MarshalText is what text, JSON and YAML encoders write.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.redacted()), nil }

// The registry. Modules register from init functions; reads take the read lock.
var registry struct {
	mu        sync.RWMutex
	providers []Registered
	stores    []Registered
}

// validName: what a name may be (it goes in a comma-separated list, a key and a flag).
func validName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for _, r := range n {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

func checkKeys(what, prefix string, keys []Key, hasConfig bool) error {
	if len(keys) > 0 && (prefix == "" || !strings.HasSuffix(prefix, ".") || !hasConfig) {
		return fmt.Errorf("%s: keys need a Prefix ending in a dot and a Config", what)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k.Name, prefix) || len(k.Name) == len(prefix) {
			return fmt.Errorf("%s: key %q is not below its prefix %q", what, k.Name, prefix)
		}
	}
	return nil
}

// RegisterProvider adds a sandbox provider. It panics on a bad or duplicate name, or keys
// outside the module's prefix: a registration is code, and a second module of one name
// would otherwise silently replace the first.
func RegisterProvider[C any](p Provider[C]) {
	if !validName(p.Name) || p.New == nil {
		panic(fmt.Sprintf("toolhost: RegisterProvider(%q): a name of a-z, 0-9, '-' and '_', and New, are required", p.Name))
	}
	if err := checkKeys("toolhost: RegisterProvider("+p.Name+")", p.Prefix, p.Keys, p.Config != nil); err != nil {
		panic(err.Error())
	}
	r := Registered{Name: p.Name, Prefix: p.Prefix, Sections: p.Sections, Keys: p.Keys}
	r.newConfig, r.validate = erase(p.Config, p.Validate)
	r.newP = func(ctx context.Context, cfg any, env Env) (sandbox.Provider, error) {
		return p.New(ctx, configOf(p.Config, cfg), env)
	}
	if p.Doctor != nil {
		r.doctor = func(ctx context.Context, cfg any, env Env, alone bool) []Check {
			return p.Doctor(ctx, configOf(p.Config, cfg), env, alone)
		}
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if slices.ContainsFunc(registry.providers, func(q Registered) bool { return q.Name == p.Name }) {
		panic(fmt.Sprintf("toolhost: RegisterProvider(%q): already registered", p.Name))
	}
	registry.providers = append(registry.providers, r)
}

// RegisterStore adds an object store; see RegisterProvider.
func RegisterStore[C any](s Store[C]) {
	if !validName(s.Kind) || s.Open == nil {
		panic(fmt.Sprintf("toolhost: RegisterStore(%q): a kind of a-z, 0-9, '-' and '_', and Open, are required", s.Kind))
	}
	if err := checkKeys("toolhost: RegisterStore("+s.Kind+")", s.Prefix, s.Keys, s.Config != nil); err != nil {
		panic(err.Error())
	}
	r := Registered{Name: s.Kind, Prefix: s.Prefix, Sections: s.Sections, Keys: s.Keys}
	r.newConfig, r.validate = erase(s.Config, s.Validate)
	r.open = func(ctx context.Context, cfg any, env Env) (Opened, error) {
		return s.Open(ctx, configOf(s.Config, cfg), env)
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if slices.ContainsFunc(registry.stores, func(q Registered) bool { return q.Name == s.Kind }) {
		panic(fmt.Sprintf("toolhost: RegisterStore(%q): already registered", s.Kind))
	}
	registry.stores = append(registry.stores, r)
}

// Providers lists the registered providers in registration order.
func Providers() []Registered {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return slices.Clone(registry.providers)
}

// Stores lists the registered stores in registration order.
func Stores() []Registered {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return slices.Clone(registry.stores)
}

// LookupProvider finds a provider by name.
func LookupProvider(name string) (Registered, bool) {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	i := slices.IndexFunc(registry.providers, func(p Registered) bool { return p.Name == name })
	if i < 0 {
		return Registered{}, false
	}
	return registry.providers[i], true
}

// LookupStore finds a store by kind.
func LookupStore(kind string) (Registered, bool) {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	i := slices.IndexFunc(registry.stores, func(s Registered) bool { return s.Name == kind })
	if i < 0 {
		return Registered{}, false
	}
	return registry.stores[i], true
}
