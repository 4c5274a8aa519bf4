package pluginreg

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/policy"
)

// Entry is a plugins entry as `plugin add` and `plugin upgrade` write it.
type Entry struct {
	Path   string
	Grants []abi.Capability
	// Exec and Files narrow sandbox_exec and sandbox_files (nil: unscoped).
	Exec  *policy.Exec
	Files *policy.Files
}

// EntryOf is the Entry of a configured plugin (its path, grants and those two scopes).
func EntryOf(p toolhost.Plugin) Entry {
	return Entry{Path: p.Path, Grants: p.Grants, Exec: p.Exec, Files: p.Files}
}

type yamlEntry struct {
	Path   string           `yaml:"path"`
	Grants []abi.Capability `yaml:"grants,flow"`
	Files  *yamlFiles       `yaml:"sandbox_files,omitempty"`
	Exec   *yamlExec        `yaml:"sandbox_exec,omitempty"`
}

type yamlFiles struct {
	Read  []string `yaml:"read,flow"`
	Write []string `yaml:"write,flow"`
}

type yamlExec struct {
	Programs []string `yaml:"programs,flow"`
}

func (e Entry) node() (*yaml.Node, error) {
	y := yamlEntry{Path: e.Path, Grants: e.Grants}
	if y.Grants == nil {
		y.Grants = []abi.Capability{}
	}
	if e.Files != nil {
		y.Files = &yamlFiles{Read: orEmpty(e.Files.Read), Write: orEmpty(e.Files.Write)}
	}
	if e.Exec != nil {
		y.Exec = &yamlExec{Programs: orEmpty(e.Exec.Programs)}
	}
	var n yaml.Node
	if err := n.Encode(y); err != nil {
		return nil, err
	}
	return &n, nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// EditConfig returns the configuration file's new bytes: the entry whose path is replace
// (when replace is not "") takes e's path and grants and, where e has them, its scopes,
// keeping its other keys; or, with replace "", e is appended to plugins. A file with no
// plugins key (or no file) loads the default plugins, current: they are written out
// first, so that adding one keeps them. Comments and the other keys stay as they were.
func EditConfig(file string, current []toolhost.Plugin, replace string, e Entry) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a mapping of keys", file)
	}
	seq := mapValue(root, "plugins")
	if seq == nil {
		seq = &yaml.Node{Kind: yaml.SequenceNode}
		for _, p := range current {
			n, err := EntryOf(p).node()
			if err != nil {
				return nil, err
			}
			seq.Content = append(seq.Content, n)
		}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "plugins"}, seq)
	}
	if seq.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s: plugins is not a list", file)
	}
	en, err := e.node()
	if err != nil {
		return nil, err
	}
	if replace == "" {
		seq.Style = 0
		seq.Content = append(seq.Content, en)
	} else {
		i := slices.IndexFunc(seq.Content, func(n *yaml.Node) bool {
			p := mapValue(n, "path")
			return p != nil && p.Value == replace
		})
		if i < 0 {
			return nil, fmt.Errorf("%s: no plugin with path %s", file, replace)
		}
		old := seq.Content[i]
		for j := 0; j+1 < len(en.Content); j += 2 {
			setMapValue(old, en.Content[j].Value, en.Content[j+1])
		}
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return out.Bytes(), enc.Close()
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func setMapValue(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			if old := m.Content[i+1]; old.Kind == yaml.ScalarNode && v.Kind == yaml.ScalarNode {
				old.Value, old.Tag, old.Style = v.Value, v.Tag, v.Style // keeps its comments
				return
			}
			v.LineComment = m.Content[i+1].LineComment
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
}

// ParseGrants reads --grant values: a capability ("sandbox_files"), or one narrowed by
// a scope: "sandbox_exec=git,ls" (the programs it may run), "sandbox_files.read=GLOB,..."
// and "sandbox_files.write=GLOB,...".
func ParseGrants(specs []string) (Entry, error) {
	var e Entry
	known := abi.Capabilities()
	add := func(c abi.Capability) error {
		if !slices.Contains(known, c) {
			var names []string
			for _, k := range known {
				names = append(names, string(k))
			}
			return fmt.Errorf("--grant %s: unknown capability (known: %s)", c, strings.Join(names, ", "))
		}
		if !slices.Contains(e.Grants, c) {
			e.Grants = append(e.Grants, c)
		}
		return nil
	}
	for _, s := range specs {
		k, v, scoped := strings.Cut(s, "=")
		var list []string
		for _, x := range strings.Split(v, ",") {
			if x = strings.TrimSpace(x); x != "" {
				list = append(list, x)
			}
		}
		switch {
		case !scoped:
			if err := add(abi.Capability(k)); err != nil {
				return Entry{}, err
			}
		case k == string(abi.CapSandboxExec):
			if e.Exec == nil {
				e.Exec = &policy.Exec{}
			}
			e.Exec.Programs = append(e.Exec.Programs, list...)
			add(abi.CapSandboxExec)
		case k == string(abi.CapSandboxFiles)+".read" || k == string(abi.CapSandboxFiles)+".write":
			if e.Files == nil {
				e.Files = &policy.Files{Read: []string{}, Write: []string{}}
			}
			if strings.HasSuffix(k, ".read") {
				e.Files.Read = append(e.Files.Read, list...)
			} else {
				e.Files.Write = append(e.Files.Write, list...)
			}
			add(abi.CapSandboxFiles)
		default:
			return Entry{}, fmt.Errorf("--grant %s: a grant is CAPABILITY, sandbox_exec=PROGRAM,..., sandbox_files.read=GLOB,... or sandbox_files.write=GLOB,... (see toolhost plugin add --help)", s)
		}
	}
	return e, nil
}
