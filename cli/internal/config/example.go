package config

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/toolhost/toolhost"
)

const exampleHeader = `# toolhost.example.yaml: every configuration key of toolhost, with its default.
# Generated from the key table (toolhost.ConfigKeys) by
#   go test ./cli/internal/config -run TestExampleFile -update
#
# Copy it to ~/.config/toolhost/toolhost.yaml (read when present), or point --config FILE
# or $TOOLHOST_CONFIG at it. A toolhost.yaml in the working directory is never read: the
# CLI mounts directories as sandbox workspaces, and what a sandbox can write must not
# configure the host. Layers, each overriding the one before:
#
#   built-in defaults  <  this file  <  TOOLHOST_ environment variables  <  flags
#
# Every key except plugins has an environment variable: TOOLHOST_ and the key in upper
# case with dots as underscores (TOOLHOST_LIMITS_MEMORY_MIB; TOOLHOST_LIMITS__MEMORY_MIB
# works too), and a flag (shown next to each key). Unknown keys, unknown TOOLHOST_
# variables and bad values are refused with a one-line error that names them. Durations
# need a unit: 90s, 10m, 1h. A key whose default depends on the machine is commented out.
`

const examplePlugins = `  # A third-party plugin, for example:
  # - path: /opt/toolhost/plugins/lint.wasm
  #   grants: [sandbox_files]
  #   env:
  #     LINT_STYLE: strict
`

// Example renders toolhost.example.yaml from the key table: every key with what it
// does, its default, its variable and its flag, in the table's order.
func Example() []byte {
	var b strings.Builder
	b.WriteString(exampleHeader)
	sections := map[string]string{}
	for _, s := range toolhost.ConfigSections() {
		sections[s.Name] = s.Doc
	}
	d := toolhost.DefaultConfig()
	open := []string{} // the sections the previous key was in
	for _, k := range toolhost.ConfigKeys() {
		parts := strings.Split(k.Name, ".")
		path := parts[:len(parts)-1]
		common := 0
		for common < len(open) && common < len(path) && open[common] == path[common] {
			common++
		}
		for i := common; i < len(path); i++ {
			name := strings.Join(path[:i+1], ".")
			ind := strings.Repeat("  ", i)
			if i == 0 {
				b.WriteString("\n")
			}
			comment(&b, ind, sections[name])
			fmt.Fprintf(&b, "%s%s:\n", ind, path[i])
		}
		open = path
		ind := strings.Repeat("  ", len(path))
		leaf := parts[len(parts)-1]
		if len(path) == 0 || common == len(path) {
			b.WriteString("\n")
		}
		comment(&b, ind, k.Doc)
		v := field(&d, k.Name)
		if k.Derived {
			comment(&b, ind, "Default: "+k.Default+".")
		}
		switch {
		case k.Secret:
			comment(&b, ind, "Env: "+k.Env+". No flag.")
		case k.Env != "":
			comment(&b, ind, "Env: "+k.Env+". Flag: --"+k.Flag+".")
		}
		if k.Env != "" {
			for _, a := range k.Aliases {
				comment(&b, ind, "Older name, still accepted: "+a.Name+" ("+a.Env+", --"+a.Flag+").")
			}
		}
		switch {
		case k.Name == "plugins":
			b.WriteString("plugins:\n")
			for _, p := range v.Interface().([]toolhost.Plugin) {
				var grants []string
				for _, g := range p.Grants {
					grants = append(grants, string(g))
				}
				fmt.Fprintf(&b, "  - path: %s\n    grants: [%s]\n", p.Path, strings.Join(grants, ", "))
				if p.Exec != nil {
					fmt.Fprintf(&b, "    sandbox_exec: {programs: [%s]}\n", strings.Join(p.Exec.Programs, ", "))
				}
			}
			b.WriteString(examplePlugins)
		case k.Example != "":
			fmt.Fprintf(&b, "%s%s: %s\n", ind, leaf, yamlScalar(v))
			comment(&b, ind, k.Example)
		case k.Derived && !v.IsZero():
			// The value is this machine's: show the rule, not a path of the machine that
			// generated the file.
			rule := k.Default[strings.LastIndex(k.Default, " ")+1:] // "... else ~/.local/share/toolhost"
			fmt.Fprintf(&b, "%s# %s: %s\n", ind, leaf, rule)
		default:
			fmt.Fprintf(&b, "%s%s: %s\n", ind, leaf, yamlScalar(v))
		}
	}
	return []byte(b.String())
}

// comment writes text as YAML comment lines at indent ind.
func comment(b *strings.Builder, ind, text string) {
	if text == "" {
		return
	}
	for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(b, "%s# %s\n", ind, line)
	}
}

// yamlScalar writes a default value as YAML.
func yamlScalar(v reflect.Value) string {
	if v.Type() == durationType {
		return durationText(time.Duration(v.Int()))
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return v.String()
	case reflect.Map:
		if v.Len() == 0 {
			return "{}"
		}
	case reflect.Slice:
		var items []string
		for i := range v.Len() {
			items = append(items, yamlScalar(v.Index(i)))
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}

// durationText writes a duration the way people do: 1h, 5m, 90s.
func durationText(d time.Duration) string {
	switch {
	case d%time.Hour == 0 && d != 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0 && d != 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
