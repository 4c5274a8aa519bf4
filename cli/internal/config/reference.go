package config

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/toolhost/toolhost"
)

const referenceHeader = `# Configuration reference

<!-- Generated from the key table (toolhost.ConfigKeys) by
     go test ./cli/internal/config -run TestReference -update
     Edit the table, not this file: a test fails when they differ. -->

Every configuration key of toolhost, with its default, its environment variable, its flag
and what it does. The same table generates [toolhost.example.yaml](../toolhost.example.yaml),
a file with every key at its default, ready to copy.

## Where configuration comes from

Layers, each overriding the one before:

    built-in defaults  <  a YAML file  <  TOOLHOST_ environment variables  <  flags

The file is ` + "`--config FILE`" + `, else ` + "`$TOOLHOST_CONFIG`" + `, else
` + "`~/.config/toolhost/toolhost.yaml`" + ` when it exists. A ` + "`toolhost.yaml`" + ` in the working directory
is never read: the CLI mounts directories as sandbox workspaces, and what a sandbox can
write must not configure the host.

Every key but the few only a file sets (` + "`plugins`, `e2b.templates`, `e2b.metadata`" + `) has a
variable, ` + "`TOOLHOST_`" + ` and the key in upper case with dots as underscores
(` + "`TOOLHOST_LIMITS_POOL_SIZE=4`" + ` sets ` + "`limits.pool_size`" + `;
` + "`TOOLHOST_LIMITS__POOL_SIZE`" + ` works too), and a flag (` + "`--pool-size 4`" + `), except secrets,
which have no flag (a command line is visible to every user of the machine). A list takes
commas in a variable or a flag (` + "`TOOLHOST_SNAPSHOT_EXCLUDES=node_modules,target`" + `). Durations
need a unit: ` + "`90s`, `10m`, `1h`" + `. An unknown key, a ` + "`TOOLHOST_`" + ` variable that sets no key (a
typo would otherwise be ignored), or a bad value stops the CLI with one line that names
it. A program embedding the library starts from ` + "`toolhost.DefaultConfig()`" + `, the same
defaults.
`

// Reference renders docs/CONFIG.md from the key table: a summary of every key, then each
// section and key with its default, variable, flag and doc, in the table's order.
func Reference() []byte {
	var b strings.Builder
	b.WriteString(referenceHeader)
	keys := toolhost.ConfigKeys()
	sections := map[string]string{}
	for _, s := range toolhost.ConfigSections() {
		sections[s.Name] = s.Doc
	}

	b.WriteString("\n## Every key\n\n| key | default | |\n|---|---|---|\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s |\n", k.Name, anchorOf(k.Name), strings.ReplaceAll(code(defaultText(k)), "|", `\|`), cell(summary(k)))
	}

	top := func(name string) string { s, _, _ := strings.Cut(name, "."); return s }
	current := "\x00"
	for _, k := range keys {
		sec := ""
		if strings.Contains(k.Name, ".") {
			sec = top(k.Name)
		}
		if sec != current {
			current = sec
			if sec == "" {
				b.WriteString("\n## Top-level keys\n")
			} else {
				fmt.Fprintf(&b, "\n## %s\n", sec)
				if doc := sections[sec]; doc != "" {
					b.WriteString("\n" + prose(doc) + "\n")
				}
			}
		}
		fmt.Fprintf(&b, "\n### `%s`\n\n", k.Name)
		var facts []string
		facts = append(facts, "Default: "+code(defaultText(k))+".")
		switch {
		case k.Secret:
			facts = append(facts, "Variable: "+code(k.Env)+"; no flag (a secret).")
		case k.Env != "":
			facts = append(facts, "Variable: "+code(k.Env)+". Flag: "+code("--"+k.Flag)+".")
		default:
			facts = append(facts, "Set in the file only.")
		}
		for _, a := range k.Aliases {
			facts = append(facts, fmt.Sprintf("Older name, still accepted: %s (%s, %s).", code(a.Name), code(a.Env), code("--"+a.Flag)))
		}
		b.WriteString(strings.Join(facts, " ") + "\n")
		if k.Doc != "" {
			b.WriteString("\n" + prose(k.Doc) + "\n")
		}
	}
	return []byte(b.String())
}

// defaultText is a key's default as the reference shows it.
func defaultText(k toolhost.ConfigKey) string {
	if k.Default == "" {
		return `""`
	}
	return k.Default
}

// summary is a key's one line: its flag's usage, else its doc's first sentence.
func summary(k toolhost.ConfigKey) string {
	if k.Usage != "" {
		return k.Usage
	}
	doc := k.Doc
	for i, line := range strings.Split(doc, "\n") {
		if listLine.MatchString(line) { // the doc's laid-out part is no summary
			doc = strings.Join(strings.Split(doc, "\n")[:i], "\n")
			break
		}
	}
	d := strings.Join(strings.Fields(doc), " ")
	if i := strings.Index(d, ". "); i >= 0 {
		d = d[:i+1]
	}
	return d
}

// anchorOf is the anchor GitHub gives the heading "`name`": lower case, dots dropped.
func anchorOf(name string) string {
	return strings.ToLower(strings.ReplaceAll(name, ".", ""))
}

// code writes s as an inline code span, with a fence longer than any run of backticks in
// it.
func code(s string) string {
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// cell is text for a table cell: code where the text is a value, pipes escaped.
func cell(s string) string {
	return strings.ReplaceAll(escape(s), "|", `\|`)
}

var listLine = regexp.MustCompile(`^(\s+\S|[-*+] |\d+[.)] )`)

// prose writes a doc comment as Markdown: paragraphs joined into lines with the
// characters Markdown would act on escaped; a doc laid out with indented lines (a list,
// an aligned table) is kept as it is in a text block.
func prose(doc string) string {
	doc = strings.TrimSpace(doc)
	for line := range strings.SplitSeq(doc, "\n") {
		if listLine.MatchString(line) {
			return "```text\n" + doc + "\n```"
		}
	}
	var paras []string
	for p := range strings.SplitSeq(doc, "\n\n") {
		paras = append(paras, escape(strings.Join(strings.Fields(p), " ")))
	}
	return strings.Join(paras, "\n\n")
}

// escape escapes, outside code spans, what Markdown would read as markup: emphasis
// (* and _ at a word's edge), HTML (<) and backslashes.
func escape(s string) string {
	var b strings.Builder
	inCode := false
	rs := []rune(s)
	for i, r := range rs {
		if r == '`' {
			inCode = !inCode
			b.WriteRune(r)
			continue
		}
		if inCode {
			b.WriteRune(r)
			continue
		}
		switch r {
		case '\\', '*', '<', '[', ']':
			b.WriteRune('\\')
		case '_':
			prevWord := i > 0 && isWord(rs[i-1])
			nextWord := i+1 < len(rs) && isWord(rs[i+1])
			if !prevWord || !nextWord {
				b.WriteRune('\\')
			}
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isWord(r rune) bool {
	return r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}
