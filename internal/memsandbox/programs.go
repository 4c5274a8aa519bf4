package memsandbox

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// The programs that make the file tree's odd corners: directories, links, FIFOs and
// modes, which the conformance suite builds to see the file API keep to the workspace;
// and yes, a stream that never ends.

// create adds a new entry at name (relative to p's directory) for a program: its
// directories are followed as the kernel follows them, anywhere in the sandbox; the
// entry itself must not exist.
func (p *proc) create(name string, n *node) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	abs := p.abs(name)
	dir, err := p.s.resolve(path.Dir(abs), true)
	if err != nil {
		return err
	}
	if d := p.s.files[dir]; d == nil || !d.dir {
		return fmt.Errorf("%s: No such file or directory", name)
	}
	target := path.Join(dir, path.Base(abs))
	if p.s.files[target] != nil {
		return fmt.Errorf("%s: File exists", name)
	}
	p.s.files[target] = n
	return nil
}

// mkdir is `mkdir [-p] DIR...`.
func mkdir(p *proc) int {
	args, parents := p.args[1:], false
	if len(args) > 0 && args[0] == "-p" {
		args, parents = args[1:], true
	}
	code := 0
	for _, name := range args {
		var err error
		if parents {
			p.s.mu.Lock()
			var dir string
			if dir, err = p.s.resolve(p.abs(name), true); err == nil {
				err = p.s.mkdirAll(dir)
			}
			p.s.mu.Unlock()
		} else {
			err = p.create(name, &node{dir: true, mode: 0o755, mod: time.Now()})
		}
		if err != nil {
			fmt.Fprintf(p.stderr, "mkdir: cannot create directory %s: %v\n", name, err)
			code = 1
		}
	}
	return code
}

// ln is `ln -s TARGET NAME`: only symbolic links, never followed when made.
func ln(p *proc) int {
	if len(p.args) != 4 || p.args[1] != "-s" {
		fmt.Fprintln(p.stderr, "ln: the memory sandbox makes only ln -s TARGET NAME")
		return 1
	}
	if err := p.create(p.args[3], &node{link: p.args[2], mode: 0o777, mod: time.Now()}); err != nil {
		fmt.Fprintf(p.stderr, "ln: failed to create symbolic link %s: %v\n", p.args[3], err)
		return 1
	}
	return 0
}

// mkfifo is `mkfifo NAME...`.
func mkfifo(p *proc) int {
	code := 0
	for _, name := range p.args[1:] {
		if err := p.create(name, &node{fifo: true, mode: 0o644, mod: time.Now()}); err != nil {
			fmt.Fprintf(p.stderr, "mkfifo: cannot create fifo %s: %v\n", name, err)
			code = 1
		}
	}
	return code
}

// chmod is `chmod OCTAL FILE...`, following links as chmod does.
func chmod(p *proc) int {
	if len(p.args) < 3 {
		fmt.Fprintln(p.stderr, "chmod: missing operand")
		return 1
	}
	mode, err := strconv.ParseUint(p.args[1], 8, 32)
	if err != nil || mode > 0o777 {
		fmt.Fprintf(p.stderr, "chmod: the memory sandbox takes only octal modes, not %q\n", p.args[1])
		return 1
	}
	code := 0
	for _, name := range p.args[2:] {
		p.s.mu.Lock()
		_, n, err := p.s.lookup(p.abs(name), true)
		if err == nil {
			n.mode = fs.FileMode(mode)
		}
		p.s.mu.Unlock()
		if err != nil {
			fmt.Fprintf(p.stderr, "chmod: cannot access %s: %v\n", name, err)
			code = 1
		}
	}
	return code
}

// yes writes "y\n" (or its arguments) until its command ends.
func yes(p *proc) int {
	line := "y"
	if len(p.args) > 1 {
		line = strings.Join(p.args[1:], " ")
	}
	chunk := []byte(strings.Repeat(line+"\n", max(1, 8192/(len(line)+1))))
	for p.ctx.Err() == nil {
		if _, err := p.stdout.Write(chunk); err != nil {
			return 1
		}
	}
	return -1
}

// notRegular is the error of a file operation on a FIFO.
func notRegular(name string) error {
	return fmt.Errorf("%s: %w", name, sandbox.ErrNotRegular)
}
