// Package apicheck guards the public surface: every exported name of a public package is
// listed in api/<package>.txt (as the Go project's api/ files list the standard library's),
// so adding, removing or changing one is a visible change to a file a reviewer reads, and
// no exported signature names a type of an internal package (an embedder could not name
// it). Run `go test ./internal/apicheck -update` after a deliberate change.
package apicheck

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api/*.txt from the code")

// public is every package a program outside the module may import: the embedding API, the
// ABI and the plugin kit, the sandbox and store interfaces with their conformance suites,
// the policy and audit types, the adapters, the experimental corner, and what a custom build
// is made of (cli, modules/standard). Everything else is internal (or a command).
var public = []string{
	".", "abi", "adapters/anthropic", "adapters/openai", "audit", "cli", "core/sandbox", "core/sandbox/sandboxtest",
	"core/store", "core/store/storetest", "experimental", "pdk", "pdk/pdktest", "pdk/policytest",
	"modules/standard", "policy",
}

const module = "github.com/toolhost/toolhost"

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPublicPackagesAreListed: the module's importable packages are exactly the public
// list, so a new package outside internal/ is a decision, not an accident.
func TestPublicPackagesAreListed(t *testing.T) {
	r := root(t)
	var found []string
	err := filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(r, p)
		rel = filepath.ToSlash(rel)
		base := d.Name()
		if rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "internal" || base == "node_modules") {
			return filepath.SkipDir
		}
		if rel != "." {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own (the duel, the S3 test gateway)
			}
		}
		pkg, err := build.Default.ImportDir(p, 0)
		if err != nil || pkg.Name == "main" || pkg.Name == "" {
			return nil
		}
		found = append(found, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(found)
	want := slices.Clone(public)
	slices.Sort(want)
	if !slices.Equal(found, want) {
		t.Errorf("importable packages outside internal/:\n got %v\nwant %v\n(move the new one under internal/, or add it to the public list and api/ on purpose)", found, want)
	}
}

// TestAPI compares each public package's exported declarations with api/<package>.txt
// and refuses a signature that names an internal package.
func TestAPI(t *testing.T) {
	r := root(t)
	for _, rel := range public {
		name := apiFile(rel)
		t.Run(name, func(t *testing.T) {
			lines, internal := exported(t, filepath.Join(r, rel))
			for _, l := range internal {
				t.Errorf("%s: an exported signature names an internal package's type: %s (give it a type of the public package, or an alias an embedder can name)", rel, l)
			}
			got := strings.Join(lines, "\n") + "\n"
			path := filepath.Join(r, "api", name)
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/apicheck -update)", err)
			}
			if string(want) != got {
				t.Errorf("the exported API of %s is not api/%s (a deliberate change? run go test ./internal/apicheck -update and commit it):\n%s",
					importPath(rel), name, diff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), lines))
			}
		})
	}
}

func importPath(rel string) string {
	if rel == "." {
		return module
	}
	return module + "/" + rel
}

func apiFile(rel string) string {
	if rel == "." {
		return "toolhost.txt"
	}
	return strings.ReplaceAll(rel, "/", "_") + ".txt"
}

// diff lists the lines only in want (-) and only in got (+).
func diff(want, got []string) string {
	var b strings.Builder
	for _, l := range want {
		if !slices.Contains(got, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}

// files are the package's non-test Go files on Linux and on wasip1 (the plugin kit has
// files for each).
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, goos := range []string{"linux", "wasip1"} {
		ctx := build.Default
		ctx.GOOS, ctx.GOARCH = goos, "amd64"
		if goos == "wasip1" {
			ctx.GOARCH = "wasm"
		}
		pkg, err := ctx.ImportDir(dir, 0)
		if err != nil {
			continue
		}
		for _, f := range pkg.GoFiles {
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no Go files", dir)
	}
	return out
}

// exported lists the exported declarations of the package in dir, one line each, sorted;
// and the lines whose signature names a type of an internal package.
func exported(t *testing.T, dir string) (lines, internal []string) {
	t.Helper()
	fset := token.NewFileSet()
	seen := map[string]bool{}
	add := func(l string) {
		if !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	for _, name := range files(t, dir) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		// The import names that stand for internal packages, in this file, and their paths.
		internalNames := map[string]string{}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains(p, "/internal/") && !strings.HasSuffix(p, "/internal") {
				continue
			}
			n := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				n = imp.Name.Name
			}
			internalNames[n] = p
		}
		str := func(n ast.Node) string {
			var b bytes.Buffer
			printer.Fprint(&b, fset, n)
			return strings.Join(strings.Fields(b.String()), " ")
		}
		check := func(line string, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				if se, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := se.X.(*ast.Ident); ok && internalNames[id.Name] != "" {
						internal = append(internal, line)
					}
				}
				return true
			})
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				sig := strings.TrimPrefix(str(d.Type), "func")
				if d.Recv != nil {
					recv := str(d.Recv.List[0].Type)
					if !ast.IsExported(strings.TrimLeft(strings.SplitN(recv, "[", 2)[0], "*")) {
						continue
					}
					l := fmt.Sprintf("method (%s) %s%s", recv, d.Name.Name, sig)
					add(l)
					check(l, d.Type)
					continue
				}
				l := fmt.Sprintf("func %s%s", d.Name.Name, sig)
				add(l)
				check(l, d.Type)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						name := s.Name.Name
						if s.TypeParams != nil {
							var params []string
							for _, f := range s.TypeParams.List {
								var names []string
								for _, n := range f.Names {
									names = append(names, n.Name)
								}
								params = append(params, strings.Join(names, ", ")+" "+str(f.Type))
							}
							name += "[" + strings.Join(params, ", ") + "]"
						}
						if s.Assign != 0 { // an alias: what it stands for is the point
							add(fmt.Sprintf("type %s = %s", name, str(s.Type)))
							// An alias of an internal type makes that type's exported fields
							// and methods public too: list them under the alias's name.
							// A generic alias (ProviderModule[C] = module.Provider[C]) lists the
							// generic type's, under its own name and type parameters.
							typ := s.Type
							switch ix := typ.(type) {
							case *ast.IndexExpr:
								typ = ix.X
							case *ast.IndexListExpr:
								typ = ix.X
							}
							if se, ok := typ.(*ast.SelectorExpr); ok {
								if id, ok := se.X.(*ast.Ident); ok && internalNames[id.Name] != "" {
									dir := filepath.Join(root(t), strings.TrimPrefix(internalNames[id.Name], module+"/"))
									for _, l := range aliased(t, dir, se.Sel.Name) {
										add(renameAliased(l, name))
									}
								}
							}
							continue
						}
						switch tt := s.Type.(type) {
						case *ast.StructType:
							add(fmt.Sprintf("type %s struct", name))
							for _, fl := range tt.Fields.List {
								typ := str(fl.Type)
								if len(fl.Names) == 0 { // embedded
									emb := strings.TrimLeft(typ, "*")
									if i := strings.LastIndex(emb, "."); i >= 0 {
										emb = emb[i+1:]
									}
									if ast.IsExported(emb) {
										l := fmt.Sprintf("type %s struct, embedded %s", name, typ)
										add(l)
										check(l, fl.Type)
									}
								}
								for _, fn := range fl.Names {
									if fn.IsExported() {
										l := fmt.Sprintf("type %s struct, %s %s", name, fn.Name, typ)
										add(l)
										check(l, fl.Type)
									}
								}
							}
						case *ast.InterfaceType:
							add(fmt.Sprintf("type %s interface", name))
							for _, m := range tt.Methods.List {
								for _, mn := range m.Names {
									if mn.IsExported() {
										l := fmt.Sprintf("type %s interface, %s%s", name, mn.Name, strings.TrimPrefix(str(m.Type), "func"))
										add(l)
										check(l, m.Type)
									}
								}
								if len(m.Names) == 0 {
									l := fmt.Sprintf("type %s interface, embedded %s", name, str(m.Type))
									add(l)
									check(l, m.Type)
								}
							}
						default:
							l := fmt.Sprintf("type %s %s", name, str(s.Type))
							add(l)
							check(l, s.Type)
						}
					case *ast.ValueSpec:
						kind := "var"
						if d.Tok == token.CONST {
							kind = "const"
						}
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							l := fmt.Sprintf("%s %s", kind, n.Name)
							if s.Type != nil {
								l += " " + str(s.Type)
								check(l, s.Type)
							}
							add(l)
						}
					}
				}
			}
		}
	}
	slices.Sort(lines)
	slices.Sort(internal)
	return lines, slices.Compact(internal)
}

// aliased lists the exported fields and methods of the type name in the package in dir,
// as exported would list them.
func aliased(t *testing.T, dir, name string) []string {
	t.Helper()
	all, _ := exported(t, dir)
	var out []string
	for _, l := range all {
		for _, p := range []string{"type " + name + " ", "type " + name + "[", "method (" + name + ") ", "method (*" + name + ") "} {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return out
}

// renameAliased is a line aliased listed, with the type it names (and its type
// parameters) named as the alias is: "type Provider[C any] struct, Name string" under
// ProviderModule[C any] is "type ProviderModule[C any] struct, Name string".
func renameAliased(l, alias string) string {
	for _, p := range []string{"type ", "method (*", "method ("} {
		if rest, ok := strings.CutPrefix(l, p); ok {
			end := strings.IndexAny(rest, " )[")
			if end >= 0 && rest[end] == '[' { // type parameters: to their closing bracket
				end = strings.Index(rest, "]") + 1
			}
			if end <= 0 {
				return l
			}
			return p + alias + rest[end:]
		}
	}
	return l
}
