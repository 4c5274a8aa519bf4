package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/cli/internal/config"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/pluginreg"
)

// The plugin commands that publish, install, pin and upgrade plugins through OCI
// registries: glue over package pluginreg.

func registryFlags(fs *pflag.FlagSet) {
	fs.Duration("timeout", pluginreg.DefaultTimeout, "bound on the whole exchange with the registry")
	fs.Int64("max-bytes", pluginreg.DefaultMaxBytes, "bound on the module's size")
}

func registryOptions(c *cli) pluginreg.Options {
	t, _ := c.flags.GetDuration("timeout")
	n, _ := c.flags.GetInt64("max-bytes")
	return pluginreg.Options{Timeout: t, MaxBytes: n}
}

// installer is the Installer of the configuration file in force (the default one when
// none is named: made if missing).
func installer(c *cli) (*pluginreg.Installer, error) {
	file := c.cfg.File
	if file == "" {
		file = config.UserConfigFile("")
	}
	keys, err := pluginreg.ReadPublicKeys(c.cfg.Registry.Keys)
	if err != nil {
		return nil, fmt.Errorf("registry.keys: %w", err)
	}
	dataDir := c.cfg.DataDir
	if dataDir == "" {
		dataDir = host.DefaultDataDir()
	}
	return &pluginreg.Installer{ConfigFile: file, DataDir: dataDir, Current: c.cfg.Plugins, Keys: keys,
		AllowUnsigned: c.cfg.Registry.AllowUnsigned, Options: registryOptions(c), Out: c.stdout,
		Validate: func(plugins []toolhost.Plugin) error {
			cfg := c.cfg.Config
			cfg.Plugins = plugins
			return cfg.Validate()
		}}, nil
}

func pluginPushCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "push"},
		args:    "FILE.wasm REF",
		summary: "publish a plugin to an OCI registry (the Wasm artifact layout)",
		help: `Inspects the module and pushes it to REF (registry/repository:tag) as a Wasm OCI
artifact: a config of type application/vnd.wasm.config.v0+json and the module as its
one application/wasm layer, with toolhost's description of it (manifest, tools,
schemas, the grants it needs) in an annotation. Credentials come from
~/.docker/config.json and its credential helpers. Prints the manifest's digest; sign
it with toolhost plugin sign.`,
		nargs: [2]int{2, 2},
		flags: registryFlags,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		wasm, err := os.ReadFile(args[0])
		if err != nil {
			return err
		}
		meta, err := pluginreg.Describe(ctx, wasm)
		if err != nil {
			return fmt.Errorf("inspecting %s: %w", args[0], err)
		}
		d, err := pluginreg.Push(ctx, args[1], wasm, meta, registryOptions(c))
		if err != nil {
			return refError(cmd, err)
		}
		fmt.Fprintf(c.stdout, "pushed %s %s to %s\ndigest %s\n", meta.Manifest.Name, meta.Manifest.Version, args[1], d)
		return nil
	}
	return cmd
}

// refError makes a bad reference a usage error.
func refError(cmd *command, err error) error {
	if errors.Is(err, pluginreg.ErrRef) {
		return usagef(cmd, "%v", err)
	}
	return err
}

func pluginSignCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "sign"},
		args:    "REF",
		summary: "sign a published plugin with a key (a Sigstore bundle attached to it)",
		help: `Signs the plugin at REF with --key (a PEM ECDSA P-256 private key) and attaches the
signature, a Sigstore bundle, to it through the OCI referrers API. Operators trust
the public key by listing it in registry.keys. --generate-key FILE writes a new key
pair first: FILE (private, 0600) and FILE.pub.`,
		nargs:    [2]int{0, 1},
		noConfig: true,
		flags: func(fs *pflag.FlagSet) {
			registryFlags(fs)
			fs.String("key", "", "the private key (PEM) to sign with")
			fs.String("generate-key", "", "write a new key pair to FILE and FILE.pub")
		},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		if gen, _ := c.flags.GetString("generate-key"); gen != "" {
			priv, pub, err := pluginreg.GenerateKey()
			if err != nil {
				return err
			}
			if _, err := os.Stat(gen); err == nil {
				return fmt.Errorf("%s exists: not overwriting a key", gen)
			}
			if err := pluginreg.WriteFiles(map[string][]byte{gen: priv, gen + ".pub": pub}, []string{gen, gen + ".pub"}); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "wrote %s and %s\n", gen, gen+".pub")
			if len(args) == 0 {
				return nil
			}
			c.flags.Set("key", gen)
		}
		if len(args) == 0 {
			return usagef(cmd, "name the plugin to sign (REF)")
		}
		keyFile, _ := c.flags.GetString("key")
		if keyFile == "" {
			return usagef(cmd, "--key is required")
		}
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return err
		}
		k, err := pluginreg.ParsePrivateKey(b)
		if err != nil {
			return fmt.Errorf("%s: %w", keyFile, err)
		}
		d, err := pluginreg.Sign(ctx, args[0], k, registryOptions(c))
		if err != nil {
			return refError(cmd, err)
		}
		fmt.Fprintf(c.stdout, "signed %s (%s) with key %s\n", args[0], d, pluginreg.KeyID(&k.PublicKey))
		return nil
	}
	return cmd
}

func pluginAddCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "add"},
		args:    "REF",
		summary: "install a plugin from an OCI registry, verified, pinned in toolhost.lock",
		help: `Pulls the plugin at REF (bounded by --max-bytes and --timeout), verifies its
signature against registry.keys (an unsigned one only from a registry in
registry.allow_unsigned), inspects the module and refuses one whose artifact says
otherwise, shows its tools and the grants it needs, and adds it to the configuration
file with the grants given, pinned by digest and signer in toolhost.lock beside it.
Every grant it needs must be given:
  --grant sandbox_files                      the whole capability
  --grant sandbox_exec=git,ls                only these programs
  --grant sandbox_files.read='src/**'        only these paths (and .write=)
On any failure the configuration and the lock stay as they were.`,
		nargs: [2]int{1, 1},
		flags: func(fs *pflag.FlagSet) {
			registryFlags(fs)
			fs.StringArray("grant", nil, "a grant accepted (repeatable): CAPABILITY, sandbox_exec=PROGRAMS, sandbox_files.read|write=GLOBS")
		},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		specs, _ := c.flags.GetStringArray("grant")
		grants, err := pluginreg.ParseGrants(specs)
		if err != nil {
			return usagef(cmd, "%v", err)
		}
		in, err := installer(c)
		if err != nil {
			return err
		}
		_, err = in.Add(ctx, args[0], grants)
		return refError(cmd, err)
	}
	return cmd
}

func pluginUpgradeCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "upgrade"},
		args:    "NAME[@VERSION]",
		summary: "upgrade an installed plugin, showing what it changes; more grants need --accept",
		help: `Pulls VERSION (a tag of the repository the plugin came from; without it, the
reference it was installed from again), verifies it as plugin add does, and shows what
changes: grants it needs that the configuration does not give (+), host imports, tools
added and removed, input schema changes that break callers (!). A version that needs
more grants is refused unless --accept, or unless the operator answers yes when asked
on a terminal (scope the new grant with --grant). On any
failure the configuration and the lock stay as they were.`,
		nargs: [2]int{1, 1},
		flags: func(fs *pflag.FlagSet) {
			registryFlags(fs)
			fs.Bool("accept", false, "accept the grants the new version needs")
			fs.StringArray("grant", nil, "the scope of an accepted grant: sandbox_exec=PROGRAMS, sandbox_files.read|write=GLOBS")
		},
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		name, version, _ := strings.Cut(args[0], "@")
		accept, _ := c.flags.GetBool("accept")
		specs, _ := c.flags.GetStringArray("grant")
		extra, err := pluginreg.ParseGrants(specs)
		if err != nil {
			return usagef(cmd, "%v", err)
		}
		in, err := installer(c)
		if err != nil {
			return err
		}
		if f, ok := c.stdin.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				in.Confirm = func(q string) bool { // a terminal: ask
					fmt.Fprint(c.stdout, q)
					line, _ := bufio.NewReader(f).ReadString('\n')
					a := strings.ToLower(strings.TrimSpace(line))
					return a == "y" || a == "yes"
				}
			}
		}
		_, err = in.Upgrade(ctx, name, version, accept, extra)
		return refError(cmd, err)
	}
	return cmd
}

func pluginVerifyCommand() *command {
	cmd := &command{
		words:   []string{"plugin", "verify"},
		summary: "check toolhost.lock against the installed modules and the registry",
		help: `For each plugin toolhost.lock pins: the module file's digest, and the registry's
artifact at the pinned digest (its module's digest, its signature by the pinned
signer). Prints one line a plugin and exits 1 if any differs.`,
		nargs: [2]int{0, 0},
		flags: registryFlags,
	}
	cmd.run = func(ctx context.Context, c *cli, args []string) error {
		in, err := installer(c)
		if err != nil {
			return err
		}
		problems, err := in.Verify(ctx)
		if err != nil {
			return err
		}
		for _, p := range problems {
			fmt.Fprintf(c.stdout, "FAIL %s\n", p)
		}
		if len(problems) > 0 {
			return fmt.Errorf("%d of the plugins in %s do not verify", len(problems), pluginreg.LockPath(in.ConfigFile))
		}
		return nil
	}
	return cmd
}

// checkLock refuses a configuration that loads a plugin whose bytes differ from
// toolhost.lock beside the configuration file.
func checkLock(l *config.Loaded) error {
	if l.File == "" {
		return nil
	}
	lock, err := pluginreg.ReadLock(pluginreg.LockPath(l.File))
	if err != nil || len(lock.Plugins) == 0 {
		return err
	}
	var paths []string
	for _, p := range l.Plugins {
		path := p.Path
		if !filepath.IsAbs(path) && l.PluginsDir != "" {
			path = filepath.Join(l.PluginsDir, path)
		}
		paths = append(paths, path)
	}
	dataDir := l.DataDir
	if dataDir == "" {
		dataDir = host.DefaultDataDir()
	}
	return lock.Check(paths, pluginreg.StampDir(dataDir))
}
