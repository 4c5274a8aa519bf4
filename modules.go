package toolhost

import (
	"reflect"

	"github.com/toolhost/toolhost/internal/module"
)

// Modules.
//
// Sandbox providers and object stores are modules: each is one value that says its name,
// the configuration keys it owns (with their docs), how to check them, how to make the
// provider or open the store, and what toolhost doctor checks for it. This package
// registers none: the built-ins (providers local, e2b and kubernetes, stores dir and s3)
// register themselves from their own packages, which package modules/standard imports (a
// program imports it for its side effect); a program adds its own with RegisterProvider or
// RegisterStore from an init function, and its keys then appear in ConfigKeys, in the CLI's flags and variables, in
// the example file and in Validate, like the built-ins' own. docs/ARCHITECTURE.md walks
// through adding one.

// ProviderModule is a sandbox provider module whose configuration is a C: its name (the
// value of sandbox.provider), its keys, and the functions that check its configuration,
// make the provider and check the machine for it, each taking the module's own *C. C is a
// struct whose fields carry `key` tags naming the keys below the module's prefix
// (struct{} for a module without keys). Its fields are documented on the type it stands
// for.
type ProviderModule[C any] = module.Provider[C]

// StoreModule is an object store module whose configuration is a C: its kind (the value
// of store.kind), its keys, and the functions that check its configuration and open the
// store.
type StoreModule[C any] = module.Store[C]

// ModuleKey documents one configuration key a module owns.
type ModuleKey = module.Key

// ModuleSection documents a section of keys a module opens.
type ModuleSection = module.Section

// ModuleEnv is what a module is made with beside its own configuration: the logger, the
// data dir, the store, and the settings every provider honours.
type ModuleEnv = module.Env

// ModuleSettings are the keys outside a module's own that providers honour (the sandbox
// limits and network, the session's lifetime).
type ModuleSettings = module.Settings

// OpenedStore is a store a StoreModule opened.
type OpenedStore = module.Opened

// RegisterProvider makes a sandbox provider available under its name (in sandbox.provider,
// alone or in a list), with its keys. Call it from an init function; a name registered
// twice panics, as the second would silently replace the first.
func RegisterProvider[C any](m ProviderModule[C]) { module.RegisterProvider(m) }

// RegisterStore makes an object store available under its kind (store.kind), with its
// keys. Call it from an init function; a kind registered twice panics.
func RegisterStore[C any](m StoreModule[C]) { module.RegisterStore(m) }

// ProviderNames lists the registered sandbox providers, in registration order.
func ProviderNames() []string {
	var out []string
	for _, p := range module.Providers() {
		out = append(out, p.Name)
	}
	return out
}

// storeKinds lists the registered stores.
func storeKinds() []string {
	var out []string
	for _, s := range module.Stores() {
		out = append(out, s.Name)
	}
	return out
}

// moduleRef is a registered module with keys, as the configuration sees it.
type moduleRef struct {
	id       string // "provider e2b", "store s3": the key of Config.modules
	name     string // e2b, s3
	prefix   string
	sections []module.Section
	keys     []module.Key
	config   func() any // the module's *C with its defaults
}

// moduleRefs lists every registered module that has keys: providers first, then stores,
// each in registration order.
func moduleRefs() []moduleRef {
	var out []moduleRef
	for _, p := range module.Providers() {
		if p.HasConfig() {
			out = append(out, moduleRef{id: "provider " + p.Name, name: p.Name, prefix: p.Prefix, sections: p.Sections, keys: p.Keys, config: p.NewConfig})
		}
	}
	for _, s := range module.Stores() {
		if s.HasConfig() {
			out = append(out, moduleRef{id: "store " + s.Name, name: s.Name, prefix: s.Prefix, sections: s.Sections, keys: s.Keys, config: s.NewConfig})
		}
	}
	return out
}

// section is the configuration of module m in c, made with its defaults when c has none
// yet (a Config that did not come from DefaultConfig).
func (c *Config) section(m moduleRef) any {
	if v, ok := c.modules[m.id]; ok {
		return v
	}
	if c.modules == nil {
		c.modules = map[string]any{}
	}
	v := m.config()
	c.modules[m.id] = v
	return v
}

// Module returns the configuration of the registered provider or store named name: a
// pointer to the module's own struct, whose fields carry `key` tags naming its keys below
// its prefix. It is for decoders that fill a configuration by those tags (the CLI's
// loader does), and for a module's own code; a program sets a key with Set. Nil when no
// module of that name has keys.
func (c *Config) Module(name string) any {
	for _, m := range moduleRefs() {
		if m.name == name {
			return c.section(m)
		}
	}
	return nil
}

// ModuleConfig is the configuration of the registered provider or store named name in c,
// as its own type: the *C its ProviderModule[C] or StoreModule[C] declared, which a program
// reads and changes in place (a key set through Set lands there too). False when no module
// of that name has keys, or its configuration is not a C.
func ModuleConfig[C any](c *Config, name string) (*C, bool) {
	v, ok := c.Module(name).(*C)
	return v, ok
}

// ModulePrefix is where the keys of the module named name live ("e2b."), or "".
func ModulePrefix(name string) string {
	for _, m := range moduleRefs() {
		if m.name == name {
			return m.prefix
		}
	}
	return ""
}

// cloneModules deep-copies the modules' configurations, so a Toolhost's configuration is
// its own.
func cloneModules(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for id, v := range m {
		out[id] = deepCopy(reflect.ValueOf(v)).Interface()
	}
	return out
}

// deepCopy copies a module's configuration: pointers, structs, slices and maps of values.
func deepCopy(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		p := reflect.New(v.Type().Elem())
		p.Elem().Set(deepCopy(v.Elem()))
		return p
	case reflect.Struct:
		s := reflect.New(v.Type()).Elem()
		s.Set(v) // unexported fields as they are
		for i := range v.NumField() {
			if s.Field(i).CanSet() {
				s.Field(i).Set(deepCopy(v.Field(i)))
			}
		}
		return s
	case reflect.Slice:
		if v.IsNil() {
			return v
		}
		s := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			s.Index(i).Set(deepCopy(v.Index(i)))
		}
		return s
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		m := reflect.MakeMapWithSize(v.Type(), v.Len())
		it := v.MapRange()
		for it.Next() {
			m.SetMapIndex(it.Key(), deepCopy(it.Value()))
		}
		return m
	}
	return v
}
