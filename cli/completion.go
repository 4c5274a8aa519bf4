package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
)

// Shell completion: the scripts ask the binary itself (the hidden __complete command)
// for the candidates of the word being completed, so they know every command, flag and
// value this binary knows, and the ids of the held sessions.

var completionScripts = map[string]string{
	"bash": `# bash completion for toolhost: source it, or put it in
# ~/.local/share/bash-completion/completions/toolhost
_toolhost() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	local IFS=$'\n'
	COMPREPLY=($(toolhost __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" -- "$cur" 2>/dev/null))
}
complete -o default -F _toolhost toolhost
`,
	"zsh": `#compdef toolhost
# zsh completion for toolhost: put it as _toolhost in a directory of $fpath, or
# source it after compinit.
_toolhost() {
	local -a candidates
	candidates=("${(@f)$(toolhost __complete "${(@)words[2,CURRENT-1]}" -- "${words[CURRENT]}" 2>/dev/null)}")
	compadd -a candidates
}
compdef _toolhost toolhost
`,
	"fish": `# fish completion for toolhost: put it in ~/.config/fish/completions/toolhost.fish
function __toolhost_complete
	set -l args (commandline -opc)
	toolhost __complete $args[2..-1] -- (commandline -ct) 2>/dev/null
end
complete -c toolhost -f -a '(__toolhost_complete)'
`,
}

func completionCommand() *command {
	cmd := &command{
		words:    []string{"completion"},
		args:     "bash|zsh|fish",
		summary:  "print a shell completion script",
		noConfig: true,
		help: `Prints the completion script of a shell. It completes commands, flags, the values of
--format and of other flags with a fixed set, and the ids of held sessions.

  source <(toolhost completion bash)                                # bash, now
  toolhost completion zsh > "${fpath[1]}/_toolhost"                 # zsh
  toolhost completion fish > ~/.config/fish/completions/toolhost.fish`,
		nargs: [2]int{1, 1},
	}
	cmd.run = func(_ context.Context, c *cli, args []string) error {
		script, ok := completionScripts[args[0]]
		if !ok {
			return usagef(cmd, "no completion for %q (shells: bash, zsh, fish)", args[0])
		}
		_, err := io.WriteString(c.stdout, script)
		return err
	}
	return cmd
}

// runComplete is what the scripts run, before any flag parsing (the words may hold
// flags): `toolhost __complete WORDS... -- CURRENT` prints the candidates for CURRENT,
// one a line.
func runComplete(args []string, stdout io.Writer) int {
	c := &cli{stdout: stdout}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range complete(ctx, c, args) {
		fmt.Fprintln(stdout, s)
	}
	return exitOK
}

// flagValues are the fixed values of flags, for completion.
var flagValues = map[string][]string{
	"log-level":        {"debug", "info", "warn", "error"},
	"log-format":       {"text", "json"},
	"store":            {"dir", "s3"},
	"network":          {"none", "host", "egress"},
	"kind":             {"agent", "auto"},
	"decision":         {"allow", "deny", "invalid"},
	"sandbox-provider": toolhost.ProviderNames(),
}

// complete returns the candidates for the last word of args (after "--"), given the
// words before it.
func complete(ctx context.Context, c *cli, args []string) []string {
	cur := ""
	if i := slices.Index(args, "--"); i >= 0 {
		if i+1 < len(args) {
			cur = args[i+1]
		}
		args = args[:i]
	}
	cmds := commands()
	// The command named so far: the positional words before cur.
	var pos []string
	prevFlag := ""
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "-"):
			prevFlag = strings.TrimLeft(a, "-")
			if strings.Contains(prevFlag, "=") {
				prevFlag = ""
			}
		default:
			if prevFlag != "" && flagTakesValue(cmds, prevFlag) {
				prevFlag = ""
				continue // the previous flag's value
			}
			prevFlag = ""
			pos = append(pos, a)
		}
	}
	cmd := matchCommand(cmds, pos)
	var out []string
	add := func(s string) {
		if strings.HasPrefix(s, cur) {
			out = append(out, s)
		}
	}
	// The value of a flag.
	if prevFlag != "" && flagTakesValue(cmds, prevFlag) {
		vals := flagValues[prevFlag]
		switch {
		case prevFlag == "format" && cmd != nil:
			vals = formatValues(cmd)
		case prevFlag == "session":
			vals = heldIDs(ctx, c)
		}
		for _, v := range vals {
			add(v)
		}
		return out
	}
	if strings.HasPrefix(cur, "-") {
		fs := pflag.NewFlagSet("", pflag.ContinueOnError)
		globalFlags(fs)
		if cmd != nil {
			cmd.addFlags(fs)
		}
		fs.VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				add("--" + f.Name)
			}
		})
		return out
	}
	if cmd == nil { // a command word
		for _, k := range cmds {
			if len(k.words) <= len(pos) || !equalWords(k.words[:len(pos)], pos) {
				continue
			}
			if w := k.words[len(pos)]; !slices.Contains(out, w) {
				add(w)
			}
		}
		return out
	}
	// Positional arguments the command takes.
	switch cmd.name() {
	case "session stop", "session commit":
		for _, id := range heldIDs(ctx, c) {
			add(id)
		}
	case "completion":
		for _, sh := range []string{"bash", "fish", "zsh"} {
			add(sh)
		}
	case "mcp config":
		for _, cl := range mcpClients {
			add(cl)
		}
	}
	return out
}

// matchCommand is the command whose words are all of pos's first words, or nil.
func matchCommand(cmds []*command, pos []string) *command {
	for _, k := range cmds {
		if len(pos) >= len(k.words) && equalWords(k.words, pos[:len(k.words)]) {
			return k
		}
	}
	return nil
}

// flagTakesValue reports whether a global flag or a flag of some command takes a value
// (is not a bool).
func flagTakesValue(cmds []*command, name string) bool {
	fs := pflag.NewFlagSet("", pflag.ContinueOnError)
	globalFlags(fs)
	if f := fs.Lookup(name); f != nil {
		return f.Value.Type() != "bool"
	}
	for _, k := range cmds {
		fs := pflag.NewFlagSet("", pflag.ContinueOnError)
		k.addFlags(fs)
		if f := fs.Lookup(name); f != nil {
			return f.Value.Type() != "bool"
		}
	}
	return false
}

// formatValues are the values cmd's --format takes.
func formatValues(cmd *command) []string {
	if cmd.name() == "tools" {
		return toolFormats
	}
	if cmd.name() == "audit" {
		return []string{"jsonl", "text"}
	}
	return []string{"text", "json"}
}

// heldIDs are the ids of the held sessions, when the daemon answers quickly.
func heldIDs(ctx context.Context, c *cli) []string {
	cl, _, err := c.sessionClient()
	if err != nil {
		return nil
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sessions, err := cl.List(ctx)
	if err != nil {
		return nil
	}
	var ids []string
	for _, s := range sessions {
		ids = append(ids, s.ID)
	}
	return ids
}
