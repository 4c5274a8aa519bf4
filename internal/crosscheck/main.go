// Command crosscheck type-checks the module from source for each GOOS/GOARCH it is given,
// tests included: what `make cross` runs (scripts/cross.sh). A call that exists on one
// platform only, made outside a file for that platform (syscall.Mmap in a test that
// Windows also builds), fails here, on this machine, not on a user's Mac.
//
// It compiles nothing: golang.org/x/tools/go/packages parses and type-checks every package
// and its dependencies from source, with cgo off as for a cross build. Per target that
// costs about the CPU of one `go vet` of a warm tree, where a `go build` for another
// platform compiles every package of the graph again (docs/DEVELOPMENT.md, "Where make
// test's time goes").
//
//	go run ./internal/crosscheck [-targets "linux/amd64 windows/arm64"] [packages]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/tools/go/packages"
)

func main() {
	targets := flag.String("targets", "linux/amd64", "the GOOS/GOARCH pairs to check, separated by spaces")
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	failed := false
	for _, t := range strings.Fields(*targets) {
		goos, goarch, ok := strings.Cut(t, "/")
		if !ok || goos == "" || goarch == "" {
			fmt.Fprintf(os.Stderr, "crosscheck: target %q is not GOOS/GOARCH (for example windows/amd64)\n", t)
			os.Exit(2)
		}
		start := time.Now()
		n, errs, err := check(goos, goarch, patterns)
		if err != nil {
			fmt.Fprintf(os.Stderr, "crosscheck: %s: %v\n", t, err)
			os.Exit(2)
		}
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "%s: %s\n", t, e)
		}
		fmt.Printf("GOOS=%s GOARCH=%s: %d packages type-checked in %s, %d errors\n", goos, goarch, n, time.Since(start).Round(time.Second), len(errs))
		failed = failed || len(errs) > 0
	}
	if failed {
		os.Exit(1)
	}
}

// check loads the packages matching patterns, their tests and every dependency for one
// target, type-checked from source, and returns how many it checked and their errors.
// An error of a package that its test variant checks again is reported once.
func check(goos, goarch string, patterns []string) (int, []string, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedDeps |
			packages.NeedTypes | packages.NeedSyntax,
		Env:   append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0"),
		Tests: true,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return 0, nil, err
	}
	n := 0
	var errs []string
	seen := map[string]bool{}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		n++
		for _, e := range p.Errors {
			if s := e.Error(); !seen[s] {
				seen[s] = true
				errs = append(errs, s)
			}
		}
	})
	return n, errs, nil
}
