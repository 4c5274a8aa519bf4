// Package codecheck holds checks of the repository's own Go code that no linter makes:
// rules of the house that a test can prove. Its tests run over every non-test Go file.
package codecheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Finding is one place that breaks a rule.
type Finding struct {
	Pos token.Position
	Msg string
}

func (f Finding) String() string { return fmt.Sprintf("%s: %s", f.Pos, f.Msg) }

// GoFiles lists the non-test Go files under root, skipping testdata, node_modules and
// hidden directories.
func GoFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if p != root && (n == "testdata" || n == "node_modules" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	return files, err
}

// ExecWithoutWaitDelay finds the functions of file that make an exec.Cmd (exec.Command,
// exec.CommandContext or an exec.Cmd literal) and never set its WaitDelay. Without one,
// Wait waits for the child's output pipes to close, which any process the child left
// behind can hold open forever: the owner of the child is then stuck with it.
func ExecWithoutWaitDelay(path string, src []byte) ([]Finding, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return nil, err
	}
	execName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"os/exec"` {
			execName = "exec"
			if imp.Name != nil {
				execName = imp.Name.Name
			}
		}
	}
	if execName == "" {
		return nil, nil
	}
	var out []Finding
	check := func(body *ast.BlockStmt) {
		var makes []token.Pos
		sets := false
		ast.Inspect(body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncLit:
				return true // a closure counts as part of its function
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && isPkg(sel.X, execName) &&
					(sel.Sel.Name == "Command" || sel.Sel.Name == "CommandContext") {
					makes = append(makes, n.Pos())
				}
			case *ast.CompositeLit:
				if sel, ok := n.Type.(*ast.SelectorExpr); ok && isPkg(sel.X, execName) && sel.Sel.Name == "Cmd" {
					makes = append(makes, n.Pos())
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "WaitDelay" {
								sets = true
							}
						}
					}
				}
			case *ast.SelectorExpr:
				if n.Sel.Name == "WaitDelay" {
					sets = true
				}
			}
			return true
		})
		if len(makes) > 0 && !sets {
			for _, p := range makes {
				out = append(out, Finding{fset.Position(p), "an exec.Cmd without WaitDelay: set one, so that a process the child leaves holding its pipes cannot hold Wait forever"})
			}
		}
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
			check(fd.Body)
		}
	}
	return out, nil
}

func isPkg(x ast.Expr, name string) bool {
	id, ok := x.(*ast.Ident)
	return ok && id.Name == name
}

// Rule is one check of a file: path names it, src is its text.
type Rule func(path string, src []byte) ([]Finding, error)

// Rules are the rules ReadAndCheck runs.
var Rules = []Rule{ExecWithoutWaitDelay, ExitInInit, ErrorText}

// ReadAndCheck runs every rule of Rules over files.
func ReadAndCheck(files []string) ([]Finding, error) {
	var out []Finding
	for _, p := range files {
		src, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		for _, rule := range Rules {
			fs, err := rule(p, src)
			if err != nil {
				return nil, err
			}
			out = append(out, fs...)
		}
	}
	return out, nil
}

// ExitInInit finds the init functions of file that end the process (os.Exit, log.Fatal*,
// or a helper's main run from init): any program that imports the package would inherit
// them. A re-executed helper registers with internal/reexec, whose Main the program calls
// first.
func ExitInInit(path string, src []byte) ([]Finding, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return nil, err
	}
	var out []Finding
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil || fd.Recv != nil || fd.Name.Name != "init" {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if _, ok := n.(*ast.FuncLit); ok {
				return false // a closure registered for later is not run by init
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
				if (isPkg(sel.X, "os") && sel.Sel.Name == "Exit") ||
					(isPkg(sel.X, "log") && strings.HasPrefix(sel.Sel.Name, "Fatal")) {
					out = append(out, Finding{fset.Position(call.Pos()), "init ends the process: every program importing the package would inherit it; register a helper with internal/reexec instead"})
				}
			}
			return true
		})
	}
	return out, nil
}

// ErrTextMark is the comment that allows one match of an error's text, on its line or the
// line above, with the reason: an error the project does not make and cannot match
// otherwise (a standard library sentinel it keeps unexported, an SDK's untyped error), or
// text a user wrote.
const ErrTextMark = "codecheck:errtext"

// textFuncs are the functions of package strings that match text.
var textFuncs = map[string]bool{"Contains": true, "ContainsAny": true, "HasPrefix": true, "HasSuffix": true, "EqualFold": true}

// ErrorText finds errors matched by their text: x.Error() given to strings.Contains and
// its kin, compared with ==, != or switched on. The project's errors are matched with
// errors.Is and errors.As (a sentinel or a type), so that a message can change without
// changing what the code does. A match the project cannot avoid carries ErrTextMark.
func ErrorText(path string, src []byte) ([]Finding, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	marked := map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.Contains(c.Text, ErrTextMark) {
				l := fset.Position(c.Pos()).Line
				marked[l], marked[l+1] = true, true
			}
		}
	}
	stringsName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"strings"` {
			stringsName = "strings"
			if imp.Name != nil {
				stringsName = imp.Name.Name
			}
		}
	}
	var out []Finding
	report := func(at ast.Node) {
		pos := fset.Position(at.Pos())
		if !marked[pos.Line] {
			out = append(out, Finding{pos, "an error matched by its text: match it with errors.Is or errors.As (a sentinel or a type of the package that makes it), or mark why it cannot be (" + ErrTextMark + ")"})
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && stringsName != "" && isPkg(sel.X, stringsName) && textFuncs[sel.Sel.Name] {
				if slices.ContainsFunc(n.Args, isErrorCall) {
					report(n)
				}
			}
		case *ast.BinaryExpr:
			if (n.Op == token.EQL || n.Op == token.NEQ) && (isErrorCall(n.X) || isErrorCall(n.Y)) {
				report(n)
			}
		case *ast.SwitchStmt:
			if n.Tag != nil && isErrorCall(n.Tag) {
				report(n)
			}
		}
		return true
	})
	return out, nil
}

// isErrorCall reports whether e is a call x.Error() with no arguments.
func isErrorCall(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Error"
}
