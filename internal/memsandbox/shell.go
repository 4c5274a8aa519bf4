package memsandbox

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The shell: `sh -c SCRIPT`. A script is simple commands separated by ;, newlines, &&, ||
// and & (a background job, which ends with the command that started it at the latest).
// Words are unquoted, '...' or "..." (in which $VAR, ${VAR}, $?, $$, $!, and $0 to $9, the
// arguments after `sh -c SCRIPT`, expand, as they do unquoted); redirections are >, >>, <,
// 2>, 2>>, >&2, 1>&2 and 2>&1. Builtins: cd, exit, exec, kill. Pipes, subshells and the
// rest of sh are not there: a script that uses them fails with exit status 2, saying so.

// part is a piece of a word: literal text, or a parameter to expand.
type part struct {
	text  string
	param bool
}

type word []part

// redirect is one redirection of a command.
type redirect struct {
	fd     int    // 0, 1 or 2
	op     string // ">", ">>", "<", ">&"
	target word   // a file, or for ">&" the fd number
}

// command is a simple command and what joins it to the next one.
type command struct {
	words []word
	redir []redirect
	sep   string // ";", "&", "&&", "||"
}

// parse turns a script into commands.
func parse(script string) ([]command, error) {
	var cmds []command
	var cur command
	var w word
	var lit strings.Builder
	inWord := false
	flushLit := func() {
		if lit.Len() > 0 {
			w = append(w, part{text: lit.String()})
			lit.Reset()
		}
	}
	endWord := func() {
		flushLit()
		if inWord {
			cur.words = append(cur.words, w)
		}
		w, inWord = nil, false
	}
	endCmd := func(sep string) error {
		endWord()
		if len(cur.words) == 0 && len(cur.redir) == 0 {
			if sep == ";" {
				return nil
			}
			return fmt.Errorf("syntax error near %q", sep)
		}
		cur.sep = sep
		cmds = append(cmds, cur)
		cur = command{}
		return nil
	}
	// param reads $NAME, ${NAME}, $?, $$ or $! at s[i] == '$'; it returns the index after.
	param := func(s string, i int) int {
		j := i + 1
		switch {
		case j < len(s) && (strings.IndexByte("?$!", s[j]) >= 0 || s[j] >= '0' && s[j] <= '9'):
			flushLit()
			w = append(w, part{text: s[j : j+1], param: true})
			return j + 1
		case j < len(s) && s[j] == '{':
			k := strings.IndexByte(s[j:], '}')
			if k < 0 {
				lit.WriteByte('$')
				return j
			}
			flushLit()
			w = append(w, part{text: s[j+1 : j+k], param: true})
			return j + k + 1
		}
		k := j
		for k < len(s) && (s[k] == '_' || s[k] >= 'a' && s[k] <= 'z' || s[k] >= 'A' && s[k] <= 'Z' || k > j && s[k] >= '0' && s[k] <= '9') {
			k++
		}
		if k == j {
			lit.WriteByte('$')
			return j
		}
		flushLit()
		w = append(w, part{text: s[j:k], param: true})
		return k
	}
	for i := 0; i < len(script); {
		c := script[i]
		switch {
		case c == ' ' || c == '\t':
			endWord()
			i++
		case c == '\n' || c == ';':
			if err := endCmd(";"); err != nil {
				return nil, err
			}
			i++
		case c == '#' && !inWord:
			for i < len(script) && script[i] != '\n' {
				i++
			}
		case c == '&' || c == '|':
			op := string(c)
			if i+1 < len(script) && script[i+1] == c {
				op += string(c)
			}
			if op == "|" {
				return nil, fmt.Errorf("pipes are not supported by the memory sandbox's shell")
			}
			if err := endCmd(op); err != nil {
				return nil, err
			}
			i += len(op)
		case c == '>' || c == '<':
			fd := 1
			if c == '<' {
				fd = 0
			}
			// A word of just "1" or "2" right before is the descriptor.
			if inWord && len(w) == 0 && (lit.String() == "1" || lit.String() == "2") {
				fd, _ = strconv.Atoi(lit.String())
				lit.Reset()
				inWord = false
			} else {
				endWord()
			}
			op := string(c)
			i++
			if c == '>' && i < len(script) && script[i] == '>' {
				op, i = ">>", i+1
			} else if c == '>' && i < len(script) && script[i] == '&' {
				op, i = ">&", i+1
			}
			for i < len(script) && (script[i] == ' ' || script[i] == '\t') {
				i++
			}
			// The target is the next word.
			start := len(cur.words)
			for i < len(script) && strings.IndexByte(" \t\n;&|<>", script[i]) < 0 {
				j, err := wordChar(script, i, &lit, &w, flushLit, param)
				if err != nil {
					return nil, err
				}
				inWord, i = true, j
			}
			endWord()
			if len(cur.words) == start {
				return nil, fmt.Errorf("syntax error: %s without a target", op)
			}
			target := cur.words[start]
			cur.words = cur.words[:start]
			cur.redir = append(cur.redir, redirect{fd: fd, op: op, target: target})
		case c == '(' || c == ')' || c == '`':
			return nil, fmt.Errorf("%q is not supported by the memory sandbox's shell", string(c))
		default:
			j, err := wordChar(script, i, &lit, &w, flushLit, param)
			if err != nil {
				return nil, err
			}
			inWord, i = true, j
		}
	}
	if err := endCmd(";"); err != nil {
		return nil, err
	}
	return cmds, nil
}

// wordChar reads one character (or quoted string, or parameter) of a word at s[i] and
// returns the index after it.
func wordChar(s string, i int, lit *strings.Builder, w *word, flushLit func(), param func(string, int) int) (int, error) {
	switch s[i] {
	case '\\':
		if i+1 < len(s) {
			if s[i+1] != '\n' {
				lit.WriteByte(s[i+1])
			}
			return i + 2, nil
		}
		return i + 1, nil
	case '\'':
		k := strings.IndexByte(s[i+1:], '\'')
		if k < 0 {
			return 0, fmt.Errorf("unterminated quote")
		}
		lit.WriteString(s[i+1 : i+1+k])
		return i + k + 2, nil
	case '"':
		j := i + 1
		for j < len(s) && s[j] != '"' {
			switch {
			case s[j] == '\\' && j+1 < len(s) && strings.IndexByte("\"\\$`", s[j+1]) >= 0:
				lit.WriteByte(s[j+1])
				j += 2
			case s[j] == '$':
				j = param(s, j)
			default:
				lit.WriteByte(s[j])
				j++
			}
		}
		if j >= len(s) {
			return 0, fmt.Errorf("unterminated quote")
		}
		if lit.Len() == 0 && len(*w) == 0 {
			*w = append(*w, part{}) // "" is a word
		}
		return j + 1, nil
	case '$':
		return param(s, i), nil
	}
	lit.WriteByte(s[i])
	return i + 1, nil
}

// shell is the state of one running script.
type shell struct {
	p      *proc
	pid    int      // $$
	args   []string // $0, $1, ...: the arguments after sh -c SCRIPT
	last   int      // $?
	lastBg int      // $!
	// bg ends each background job of this shell by its pid, for kill. Only the shell's own
	// goroutine touches it.
	bg map[int]context.CancelFunc
}

// runShell is sh and bash: `sh -c SCRIPT [NAME [ARG...]]`.
func runShell(p *proc) int {
	if len(p.args) < 3 || p.args[1] != "-c" {
		fmt.Fprintf(p.stderr, "%s: the memory sandbox's shell runs only -c SCRIPT\n", p.args[0])
		return 2
	}
	cmds, err := parse(p.args[2])
	if err != nil {
		fmt.Fprintf(p.stderr, "%s: %v\n", p.args[0], err)
		return 2
	}
	sh := &shell{p: &proc{s: p.s, ctx: p.ctx, args: p.args, env: p.env, cwd: p.cwd,
		stdin: p.stdin, stdout: p.stdout, stderr: p.stderr, jobs: p.jobs}, args: p.args[3:]}
	if len(sh.args) == 0 {
		sh.args = p.args[:1]
	}
	p.s.mu.Lock()
	p.s.pid++
	sh.pid = p.s.pid
	p.s.mu.Unlock()
	// Its background jobs run under the command's context, so they end with it.
	return sh.run(cmds)
}

func (sh *shell) expand(w word) string {
	var b strings.Builder
	for _, pt := range w {
		if !pt.param {
			b.WriteString(pt.text)
			continue
		}
		switch pt.text {
		case "?":
			b.WriteString(strconv.Itoa(sh.last))
		case "$":
			b.WriteString(strconv.Itoa(sh.pid))
		case "!":
			b.WriteString(strconv.Itoa(sh.lastBg))
		case "0", "1", "2", "3", "4", "5", "6", "7", "8", "9":
			if n, _ := strconv.Atoi(pt.text); n < len(sh.args) {
				b.WriteString(sh.args[n])
			}
		default:
			b.WriteString(sh.p.env[pt.text])
		}
	}
	return b.String()
}

func (sh *shell) run(cmds []command) int {
	skip := false
	for _, c := range cmds {
		if sh.p.ctx.Err() != nil {
			return -1
		}
		if !skip {
			if c.sep == "&" {
				sh.background(c)
				sh.last = 0
			} else {
				code, exit := sh.simple(c)
				sh.last = code
				if exit {
					return code
				}
			}
		}
		switch c.sep {
		case "&&":
			skip = sh.last != 0
		case "||":
			skip = sh.last == 0
		default:
			skip = false
		}
	}
	if sh.p.ctx.Err() != nil {
		return -1
	}
	return sh.last
}

// background runs c as a job of the command; the job ends with the command.
func (sh *shell) background(c command) {
	s := sh.p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return // Close is waiting for the processes: none may start now
	}
	s.pid++
	sh.lastBg = s.pid
	// A job has a context of its own under the command's, so kill can end it alone.
	jctx, jcancel := context.WithCancel(sh.p.ctx)
	jp := *sh.p
	jp.ctx = jctx
	job := &shell{p: &jp, pid: sh.pid, args: sh.args, last: sh.last}
	if sh.bg == nil {
		sh.bg = map[int]context.CancelFunc{}
	}
	sh.bg[s.pid] = jcancel
	s.wg.Add(1)
	if sh.p.jobs != nil {
		sh.p.jobs.Add(1)
	}
	go func() { // owned by the sandbox and the command: their contexts end it, both wait
		defer s.wg.Done()
		if sh.p.jobs != nil {
			defer sh.p.jobs.Done()
		}
		defer jcancel()
		job.simple(c)
	}()
}

// simple runs one simple command; exit says the script ends here.
func (sh *shell) simple(c command) (code int, exit bool) {
	var args []string
	for _, w := range c.words {
		args = append(args, sh.expand(w))
	}
	p := *sh.p
	p.args = args
	if err := sh.redirect(&p, c.redir); err != nil {
		fmt.Fprintf(sh.p.stderr, "sh: %v\n", err)
		return 1, false
	}
	if len(args) == 0 {
		return 0, false
	}
	if args[0] == "exec" {
		args = args[1:]
		p.args = args
		if len(args) == 0 {
			return 0, false
		}
		code, _ := sh.builtinOrProgram(&p)
		return code, true
	}
	return sh.builtinOrProgram(&p)
}

func (sh *shell) builtinOrProgram(p *proc) (int, bool) {
	switch p.args[0] {
	case "exit":
		code := sh.last
		if len(p.args) > 1 {
			n, err := strconv.Atoi(p.args[1])
			if err != nil {
				fmt.Fprintf(sh.p.stderr, "sh: exit: illegal number: %s\n", p.args[1])
				return 2, true
			}
			code = n & 0xff
		}
		return code, true
	case "cd":
		dir := sh.p.env["HOME"]
		if len(p.args) > 1 {
			dir = p.abs(p.args[1])
		}
		sh.p.s.mu.Lock()
		_, n, err := sh.p.s.lookup(dir, true)
		sh.p.s.mu.Unlock()
		if err != nil || !n.dir {
			fmt.Fprintf(sh.p.stderr, "sh: cd: can't cd to %s\n", p.args[len(p.args)-1])
			return 2, false
		}
		sh.p.cwd = dir
		return 0, false
	case "kill":
		return sh.kill(p)
	}
	prog, ok := lookupProgram(p.args[0])
	if !ok {
		fmt.Fprintf(p.stderr, "sh: %s: not found\n", p.args[0])
		return 127, false
	}
	return prog(p), false
}

// redirect applies c's redirections to p.
func (sh *shell) redirect(p *proc, rs []redirect) error {
	for _, r := range rs {
		target := sh.expand(r.target)
		switch r.op {
		case ">&":
			var w io.Writer
			switch target {
			case "1":
				w = p.stdout
			case "2":
				w = p.stderr
			default:
				return fmt.Errorf("%d>&%s: bad descriptor", r.fd, target)
			}
			if r.fd == 2 {
				p.stderr = w
			} else {
				p.stdout = w
			}
		case "<":
			b, err := p.readFile(target)
			if err != nil {
				return fmt.Errorf("cannot open %v", err)
			}
			p.stdin = strings.NewReader(string(b))
		case ">", ">>":
			abs := p.abs(target)
			p.s.mu.Lock()
			var err error
			if r.op == ">" {
				err = p.s.write(abs, nil, false)
			} else {
				err = p.s.write(abs, nil, true)
			}
			p.s.mu.Unlock()
			if err != nil {
				return fmt.Errorf("cannot create %s: %v", target, err)
			}
			w := &fileWriter{s: p.s, path: abs}
			if r.fd == 2 {
				p.stderr = w
			} else {
				p.stdout = w
			}
		}
	}
	return nil
}

// kill is `kill [-SIGNAL] PID...`: the shell's own pid ($$) ends the shell at once, killed
// by a signal (exit status -1 to Exec, as for a real shell); a job's pid ($!) ends that
// job. Any other pid is not this shell's to kill.
func (sh *shell) kill(p *proc) (int, bool) {
	args := p.args[1:]
	if len(args) > 0 && strings.HasPrefix(args[0], "-") {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(p.stderr, "kill: usage: kill [-SIGNAL] PID...")
		return 2, false
	}
	code, self := 0, false
	for _, a := range args {
		pid, err := strconv.Atoi(a)
		switch {
		case err != nil:
			fmt.Fprintf(p.stderr, "kill: illegal pid: %s\n", a)
			code = 1
		case pid == sh.pid:
			self = true
		case sh.bg[pid] != nil:
			sh.bg[pid]()
		default:
			fmt.Fprintf(p.stderr, "kill: (%d) - No such process\n", pid)
			code = 1
		}
	}
	if self {
		return -1, true
	}
	return code, false
}
