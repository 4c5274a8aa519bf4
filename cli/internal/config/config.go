// Package config loads the toolhost CLI's configuration into a toolhost.Config: built-in
// defaults, then a YAML file, then TOOLHOST_ environment variables, then command-line
// flags, each layer overriding the one before. Every key, with its variable, flag,
// default and doc, comes from the one table toolhost.ConfigKeys; this package only layers
// the sources.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
)

// EnvConfigFile names the config file when --config is not given.
const EnvConfigFile = "TOOLHOST_CONFIG"

// DefaultFileName is the config file looked for in the user's configuration directory
// (ConfigHome/toolhost/toolhost.yaml) when neither --config nor TOOLHOST_CONFIG names one.
//
// Never in the working directory: the CLI mounts directories as sandbox workspaces, and a
// file a sandbox can write must never configure the host (a sandbox that could write
// ./toolhost.yaml could give the next command the host's network, or a browser of its
// choosing).
const DefaultFileName = "toolhost.yaml"

// otherVars are the TOOLHOST_ variables that are not configuration keys; any other
// TOOLHOST_ variable is refused, like an unknown key in the file.
var otherVars = map[string]string{
	EnvConfigFile:              "the config file",
	"TOOLHOST_BROWSER_PACKAGE": "the Debian package scripts/setup-browser.sh installs",
	"TOOLHOST_BENCH_DIR":       "where benchmarks put their scratch files",
	"TOOLHOST_E2B_SDK_DIR":     "where scripts/setup-e2b-sdk.sh installs E2B's SDK for the tests",
	"TOOLHOST_MCP_CLIENT_DIR":  "where scripts/setup-mcp-client.sh installs the MCP SDK's client for the tests",
}

// UserConfigFile is the default config file under configHome (os.UserConfigDir when
// empty): configHome/toolhost/toolhost.yaml.
func UserConfigFile(configHome string) string {
	if configHome == "" {
		return toolhost.DefaultConfigFile() // the one the trust check guards
	}
	return filepath.Join(configHome, "toolhost", DefaultFileName)
}

// Default returns the built-in defaults: toolhost.DefaultConfig.
func Default() toolhost.Config { return toolhost.DefaultConfig() }

// Keys lists every configuration key, in the table's order.
func Keys() []string {
	var out []string
	for _, k := range toolhost.ConfigKeys() {
		out = append(out, k.Name)
	}
	return out
}

// EnvName is the variable that sets key, e.g. TOOLHOST_LIMITS_MEMORY_MIB. A double
// underscore may stand for the dot as well (TOOLHOST_LIMITS__MEMORY_MIB).
func EnvName(key string) string { return toolhost.EnvName(key) }

// table is the key table with what the loader derives from it.
type table struct {
	keys    []toolhost.ConfigKey
	env     map[string]string // variable (both spellings, older names too) -> key
	flags   map[string]string // flag name (older names too) -> key
	aliases map[string]string // older key name -> key
	lists   map[string]bool   // keys whose variable is a comma-separated list
	maps    []string          // keys that hold a mapping (the file's names under them are its own)
}

func loadTable() *table {
	t := &table{keys: toolhost.ConfigKeys(), env: map[string]string{}, flags: map[string]string{},
		aliases: map[string]string{}, lists: map[string]bool{}}
	addEnv := func(name, key string) {
		t.env[toolhost.EnvName(name)] = key
		t.env[toolhost.EnvPrefix+strings.ToUpper(strings.ReplaceAll(name, ".", "__"))] = key
	}
	for _, k := range t.keys {
		if k.Type.Kind() == reflect.Map {
			t.maps = append(t.maps, k.Name)
		}
		if k.Env == "" {
			continue // plugins, e2b.templates, e2b.metadata: the file only
		}
		addEnv(k.Name, k.Name)
		if k.Flag != "" { // not a secret's
			t.flags[k.Flag] = k.Name
		}
		t.lists[k.Name] = k.Type.Kind() == reflect.Slice
		for _, a := range k.Aliases {
			addEnv(a.Name, k.Name)
			t.flags[a.Flag] = k.Name
			t.aliases[a.Name] = k.Name
		}
	}
	return t
}

func (t *table) known(key string) bool {
	return slices.ContainsFunc(t.keys, func(k toolhost.ConfigKey) bool { return k.Name == key }) || t.aliases[key] != "" ||
		slices.ContainsFunc(t.maps, func(m string) bool { return strings.HasPrefix(key, m+".") })
}

var durationType = reflect.TypeFor[time.Duration]()

// RegisterFlags adds --config and one flag per key (but plugins) to fs. The defaults shown
// are the built-in ones; a flag only counts when it is given.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String("config", "", "config file (default $"+EnvConfigFile+", else ~/.config/toolhost/"+DefaultFileName+" if present; never ./"+DefaultFileName+")")
	d := toolhost.DefaultConfig()
	for _, k := range toolhost.ConfigKeys() {
		if k.Flag == "" {
			continue
		}
		def := field(&d, k.Name)
		registerFlag(fs, k.Flag, k.Type, def, k.Derived, k.Usage)
		for _, a := range k.Aliases {
			registerFlag(fs, a.Flag, k.Type, def, k.Derived, "older name of --"+k.Flag)
			fs.MarkHidden(a.Flag)
		}
	}
}

// registerFlag adds one flag of the key's type. A derived default is not shown as a value
// (the usage says how it is found).
func registerFlag(fs *pflag.FlagSet, name string, typ reflect.Type, def reflect.Value, derived bool, usage string) {
	if derived {
		def = reflect.Zero(typ)
	}
	switch {
	case typ == durationType:
		fs.Duration(name, time.Duration(def.Int()), usage)
	case typ.Kind() == reflect.String:
		fs.String(name, def.String(), usage)
	case typ.Kind() == reflect.Bool:
		fs.Bool(name, def.Bool(), usage)
	case typ.Kind() == reflect.Int:
		fs.Int(name, int(def.Int()), usage)
	case typ.Kind() == reflect.Int64:
		fs.Int64(name, def.Int(), usage)
	case typ.Kind() == reflect.Float64:
		fs.Float64(name, def.Float(), usage)
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.String:
		fs.StringSlice(name, def.Interface().([]string), usage)
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Int:
		fs.IntSlice(name, def.Interface().([]int), usage)
	default:
		panic(fmt.Sprintf("config: flag --%s: no flag type for %s", name, typ))
	}
}

// field is the value of the dotted key in c: one of the keys every part shares, or one of
// a module's (a provider's or a store's).
func field(c *toolhost.Config, key string) reflect.Value {
	v, err := c.Get(key)
	if err != nil {
		panic(err) // the table names only keys Get knows
	}
	return reflect.ValueOf(v)
}

// Sources says where Load reads from.
type Sources struct {
	// Flags is a parsed flag set that RegisterFlags was called on; nil for none.
	Flags *pflag.FlagSet
	// Environ is the environment as KEY=VALUE strings; nil means os.Environ().
	Environ []string
	// ConfigHome is the user's configuration directory, where toolhost/toolhost.yaml is
	// read from when no file is named; empty means os.UserConfigDir ($XDG_CONFIG_HOME, else
	// ~/.config).
	ConfigHome string
}

// Loaded is a configuration and where it came from.
type Loaded struct {
	toolhost.Config
	// File is the config file read, or "" when none was.
	File string
}

// Load builds the configuration: defaults, then the YAML file, then TOOLHOST_ variables,
// then the flags that were given. Errors name the offending key (or variable) and fit on
// one line.
func Load(src Sources) (*Loaded, error) {
	environ := src.Environ
	if environ == nil {
		environ = os.Environ()
	}
	getenv := func(name string) (string, bool) {
		for _, kv := range environ {
			if k, v, ok := strings.Cut(kv, "="); ok && k == name {
				return v, true
			}
		}
		return "", false
	}
	t := loadTable()

	k := koanf.New(".")
	if err := k.Load(confmap.Provider(defaultMap(t), "."), nil); err != nil {
		return nil, fmt.Errorf("config: loading defaults: %w", err)
	}

	// 1. The file.
	path, explicit := "", false
	if src.Flags != nil {
		if f := src.Flags.Lookup("config"); f != nil && f.Changed {
			path, explicit = f.Value.String(), true
		}
	}
	if !explicit {
		if v, ok := getenv(EnvConfigFile); ok && v != "" {
			path, explicit = v, true
		}
	}
	if !explicit {
		if cand := UserConfigFile(src.ConfigHome); cand != "" {
			if st, err := os.Stat(cand); err == nil && st.Mode().IsRegular() {
				path = cand
			}
		}
	}
	if path != "" {
		if err := loadFile(t, k, path); err != nil {
			return nil, err
		}
	}

	// 2. The environment: every TOOLHOST_ variable is a key's or one of otherVars.
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, toolhost.EnvPrefix) || t.env[name] != "" || otherVars[name] != "" {
			continue
		}
		return nil, fmt.Errorf("config: %s is not a toolhost variable: no configuration key is named %s (the keys and their variables are in toolhost.example.yaml); unset it",
			name, strings.ToLower(strings.TrimPrefix(name, toolhost.EnvPrefix)))
	}
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:      toolhost.EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, v string) (string, any) {
			key, ok := t.env[name]
			if !ok || v == "" {
				return "", nil
			}
			if t.lists[key] {
				var list []any
				for item := range strings.SplitSeq(v, ",") {
					if item = strings.TrimSpace(item); item != "" {
						list = append(list, item)
					}
				}
				return key, list
			}
			return key, v
		},
	}), nil)
	if err != nil {
		return nil, fmt.Errorf("config: reading the environment: %w", err)
	}

	// 3. The flags that were given.
	if src.Flags != nil {
		err := k.Load(posflag.ProviderWithFlag(src.Flags, ".", k, func(f *pflag.Flag) (string, any) {
			key, ok := t.flags[f.Name]
			if !ok || !f.Changed {
				return "", nil
			}
			return key, posflag.FlagVal(src.Flags, f)
		}), nil)
		if err != nil {
			return nil, fmt.Errorf("config: reading flags: %w", err)
		}
	}

	var c toolhost.Config
	if err := decodeModules(t, k, &c); err != nil {
		return nil, err
	}
	if err := decode(k, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &Loaded{Config: c, File: path}, nil
}

// loadFile merges a YAML file into k after checking it names only known keys.
func loadFile(t *table, k *koanf.Koanf, path string) error {
	fk := koanf.New(".")
	if err := fk.Load(file.Provider(path), yaml.Parser()); err != nil {
		return fmt.Errorf("config file %s: %s", path, oneLine(err))
	}
	for old, key := range t.aliases {
		if !fk.Exists(old) {
			continue
		}
		if fk.Exists(key) {
			return fmt.Errorf("config file %s: %s and %s are the same setting (%s is its older name): set only %s", path, key, old, old, key)
		}
		fk.Set(key, fk.Get(old))
		fk.Delete(old)
	}
	for _, key := range fk.Keys() {
		if t.known(key) {
			continue
		}
		var section []string
		for _, k := range t.keys {
			if rest, ok := strings.CutPrefix(k.Name, key+"."); ok {
				section = append(section, rest)
			}
		}
		if len(section) > 0 {
			return fmt.Errorf("config file %s: %s: must be a mapping of %s, got %v", path, key, strings.Join(section, ", "), fk.Get(key))
		}
		return fmt.Errorf("config file %s: unknown key %q (known: %s)", path, key, strings.Join(Keys(), ", "))
	}
	if err := k.Merge(fk); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// defaultMap is toolhost.DefaultConfig as a flat koanf map.
func defaultMap(t *table) map[string]any {
	d := toolhost.DefaultConfig()
	m := map[string]any{}
	for _, k := range t.keys {
		v := field(&d, k.Name)
		switch {
		case k.Name == "plugins":
			var list []any
			for _, p := range v.Interface().([]toolhost.Plugin) {
				grants := make([]any, len(p.Grants))
				for i, g := range p.Grants {
					grants[i] = string(g)
				}
				entry := map[string]any{"path": p.Path, "grants": grants}
				if p.Exec != nil {
					progs := make([]any, len(p.Exec.Programs))
					for i, prog := range p.Exec.Programs {
						progs[i] = prog
					}
					entry["sandbox_exec"] = map[string]any{"programs": progs}
				}
				list = append(list, entry)
			}
			m[k.Name] = list
		case v.Kind() == reflect.Slice:
			list := make([]any, v.Len())
			for i := range list {
				list[i] = v.Index(i).Interface()
			}
			m[k.Name] = list
		default:
			m[k.Name] = v.Interface()
		}
	}
	return m
}

// durationHook decodes "10s"-style strings into durations and refuses bare numbers, which
// would otherwise silently mean nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch from.Kind() {
	case reflect.String:
		d, err := time.ParseDuration(strings.TrimSpace(data.(string)))
		if err != nil {
			return nil, fmt.Errorf("not a duration: %q (write it with a unit, e.g. \"30s\", \"10m\")", data)
		}
		return d, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		if from == durationType {
			return data, nil
		}
		return nil, fmt.Errorf("a duration needs a unit: got %v (write e.g. \"%vs\")", data, data)
	}
	return data, nil
}

// decodeModules decodes the keys of each module (a provider's, a store's) into its own
// configuration, c.Module(name), and takes them out of k, which then holds only the keys
// every part shares.
func decodeModules(t *table, k *koanf.Koanf, c *toolhost.Config) error {
	byModule := map[string][]string{}
	var order []string
	for _, key := range t.keys {
		if key.Module == "" {
			continue
		}
		if _, ok := byModule[key.Module]; !ok {
			order = append(order, key.Module)
		}
		byModule[key.Module] = append(byModule[key.Module], key.Name)
	}
	for _, name := range order {
		prefix := toolhost.ModulePrefix(name)
		tree := map[string]any{}
		for _, key := range byModule[name] {
			if !k.Exists(key) {
				continue
			}
			// A nested map per section below the prefix: "s3.bucket" under store.
			parts := strings.Split(strings.TrimPrefix(key, prefix), ".")
			m := tree
			for _, p := range parts[:len(parts)-1] {
				sub, ok := m[p].(map[string]any)
				if !ok {
					sub = map[string]any{}
					m[p] = sub
				}
				m = sub
			}
			m[parts[len(parts)-1]] = k.Get(key)
			k.Delete(key)
		}
		if err := decodeInto(tree, c.Module(name)); err != nil {
			return prefixed(err, strings.TrimSuffix(prefix, "."))
		}
	}
	// A section left empty (store.s3 once its keys are out) is not an unused key.
	for _, name := range order {
		prefix := strings.TrimSuffix(toolhost.ModulePrefix(name), ".")
		if v, ok := k.Get(prefix).(map[string]any); ok && len(v) == 0 {
			k.Delete(prefix)
		}
	}
	return nil
}

// decodeInto decodes a tree of keys into a configuration struct by its key tags.
func decodeInto(tree map[string]any, result any) error {
	d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:       durationHook,
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		ZeroFields:       true,
		TagName:          "key",
		Result:           result,
	})
	if err != nil {
		return err
	}
	return d.Decode(tree)
}

// prefixed is a decode error of a module's keys, named by their whole key.
func prefixed(err error, section string) error {
	if de := firstDecodeError(err); de != nil {
		return fmt.Errorf("config: %s.%s: %s", section, de.Name(), oneLine(describeDecode(de.Unwrap())))
	}
	return fmt.Errorf("config: %s: %s", section, oneLine(err))
}

func decode(k *koanf.Koanf, c *toolhost.Config) error {
	err := k.UnmarshalWithConf("", c, koanf.UnmarshalConf{
		Tag: "key",
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:       durationHook,
			ErrorUnused:      true,
			WeaklyTypedInput: true,
			TagName:          "key",
			Result:           c,
		},
	})
	if err == nil {
		return nil
	}
	if de := firstDecodeError(err); de != nil {
		return fmt.Errorf("config: %s: %s", de.Name(), oneLine(describeDecode(de.Unwrap())))
	}
	return fmt.Errorf("config: %s", oneLine(err))
}

// firstDecodeError finds the first mapstructure error that names a field.
func firstDecodeError(err error) *mapstructure.DecodeError {
	var de *mapstructure.DecodeError
	if errors.As(err, &de) {
		return de
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if d := firstDecodeError(e); d != nil {
				return d
			}
		}
	}
	return nil
}

func describeDecode(err error) error {
	var pe *mapstructure.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("not a valid %s: %v", pe.Expected.Type(), pe.Value)
	}
	var ue *mapstructure.UnconvertibleTypeError
	if errors.As(err, &ue) {
		return fmt.Errorf("expected a %s, got %v", ue.Expected.Type(), ue.Value)
	}
	return err
}

// oneLine folds an error message onto one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
