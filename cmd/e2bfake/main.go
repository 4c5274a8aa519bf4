//go:build linux

// Command e2bfake runs the fake E2B of internal/sandbox/e2b/e2bfake on its own, so any E2B
// client can be pointed at it: the control plane and every sandbox's envd on one
// listener, each sandbox a real local sandbox (bubblewrap). It prints the environment the
// official SDKs read, then serves until interrupted:
//
//	e2bfake [-listen 127.0.0.1:0] [-tls] [-ca-out ca.pem] [-domain e2b.test]
//	        [-api-key e2b_...] [-max-lifetime 1h] [-max-concurrent 20]
//	        [-template name:cpus:memoryMB ...]
//
//	eval "$(e2bfake -listen 127.0.0.1:3000 &)"   # or copy the printed lines
//	node my-e2b-script.js
//
// Faults are injected over HTTP (POST /_fake/faults with a JSON fault, DELETE to clear;
// POST /_fake/vanish?id=; POST /_fake/lose-files?id=), with the API key.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/internal/reexec"
	"github.com/toolhost/toolhost/internal/sandbox/e2b/e2bfake"
	"github.com/toolhost/toolhost/internal/sandbox/local"
)

type templates []e2bfake.Template

func (t *templates) String() string { return fmt.Sprint(*t) }

func (t *templates) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) != 3 {
		return fmt.Errorf("want name:cpus:memoryMB, got %q", v)
	}
	cpus, err1 := strconv.Atoi(parts[1])
	mem, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil || cpus < 1 || mem < 1 {
		return fmt.Errorf("want name:cpus:memoryMB with positive numbers, got %q", v)
	}
	*t = append(*t, e2bfake.Template{ID: parts[0], CPUCount: cpus, MemoryMB: mem})
	return nil
}

func main() {
	reexec.Main() // the local provider's sandbox agent is this binary, re-executed
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2bfake:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on (keep it on loopback)")
	useTLS := flag.Bool("tls", false, "serve HTTPS with a certificate of a CA made for this run")
	caOut := flag.String("ca-out", "", "with -tls, write the CA's PEM here (for NODE_EXTRA_CA_CERTS, SSL_CERT_FILE)")
	domain := flag.String("domain", e2bfake.DefaultDomain, "the fake's domain: sandboxes are {port}-{id}.{domain}")
	key := flag.String("api-key", e2bfake.DefaultAPIKey, "the one API key accepted")
	maxLife := flag.Duration("max-lifetime", time.Hour, "the plan's longest sandbox lifetime (Hobby 1h, Pro 24h)")
	maxConc := flag.Int("max-concurrent", 20, "running sandboxes at once (Hobby 20, Pro 100)")
	verbose := flag.Bool("v", false, "log every sandbox event")
	var tmpl templates
	flag.Var(&tmpl, "template", "a template as name:cpus:memoryMB (repeatable; default base:2:512)")
	flag.Parse()

	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	lp, err := local.New(local.Config{MaxLifetime: *maxLife + 2*time.Hour, DefaultTimeout: time.Hour, Logger: log})
	if err != nil {
		return err
	}
	defer lp.Close(context.Background())
	f, err := e2bfake.New(e2bfake.Config{Local: lp, APIKey: *key, Domain: *domain, TLS: *useTLS,
		Templates: tmpl, MaxLifetime: *maxLife, MaxConcurrent: *maxConc, Logger: log})
	if err != nil {
		return err
	}
	if err := f.Listen(*listen); err != nil {
		return err
	}
	if *useTLS && *caOut != "" {
		if err := os.WriteFile(*caOut, f.CAPEM(), 0o644); err != nil {
			return err
		}
	}
	for _, kv := range f.Env() {
		fmt.Println("export " + kv)
	}
	if *useTLS && *caOut != "" {
		fmt.Println("export NODE_EXTRA_CA_CERTS=" + *caOut)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return f.Close(cctx)
}
