package toolhost

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
)

// EnvPrefix starts the environment variable of every configuration key.
const EnvPrefix = "TOOLHOST_"

// ConfigKey describes one key of Config: the one table that the CLI's flags and variables,
// DefaultConfig and toolhost.example.yaml all come from.
type ConfigKey struct {
	// Name is the key as written in YAML, sections joined by dots: "sandbox.memory_mib".
	Name string
	// Env is the variable that sets it: EnvPrefix and the name in upper case with dots as
	// underscores. Empty for the keys only a file sets (plugins, e2b.templates,
	// e2b.metadata: lists and mappings).
	Env string
	// Flag is the CLI's flag that sets it, without the dashes; empty for the keys only a
	// file sets, and for secrets.
	Flag string
	// Secret: the value is a credential (e2b.api_key). It has a variable but no flag (a
	// command line is visible to every user of the machine), and it is of type Secret,
	// which never prints.
	Secret bool
	// Default is the default as YAML shows it, or, when Derived, how it is found.
	Default string
	// Derived: the default depends on the machine or on another key ("$XDG_DATA_HOME/
	// toolhost, else ~/.local/share/toolhost"; store.dir's data_dir/store).
	Derived bool
	// Usage is one line: the flag's help.
	Usage string
	// Doc says what the key does, in full (toolhost.example.yaml's comment).
	Doc string
	// Aliases are older names of the key, still accepted in files; each also has its
	// variable (AliasEnv) and a hidden flag.
	Aliases []Alias
	// Type is the Go type of the key's field, for parsers.
	Type reflect.Type
}

// Alias is an older name of a key.
type Alias struct {
	Name string // "sandbox.timeout"
	Env  string // "TOOLHOST_SANDBOX_TIMEOUT"
	Flag string // "sandbox-timeout"
}

// ConfigSection describes a section of keys (store, snapshot, ...) for the example file.
type ConfigSection struct {
	Name, Doc string
}

// key is an entry of the table; see ConfigKey.
type key struct {
	name, flag string
	// def is the default: a value of the field's type, or a func() any computing it.
	def any
	// defText, when set, is how the default reads (for a default that depends on the
	// machine, or one derived from another key).
	defText    string
	usage, doc string
	aliases    []Alias
	// secret: a variable, no flag (see ConfigKey.Secret).
	secret bool
}

func (k key) defaultValue() any {
	if f, ok := k.def.(func() any); ok {
		return f()
	}
	return k.def
}

// builtinPlugins is the plugins key's default: every built-in with the grants it needs.
func builtinPlugins() []Plugin {
	var out []Plugin
	for _, b := range builtins.Builtins() {
		out = append(out, Plugin{Path: b.File, Grants: b.Grants})
	}
	return out
}

// keyTable is every configuration key, in the order of toolhost.example.yaml.
var keyTable = []key{
	{name: "data_dir", flag: "data-dir", def: func() any { return host.DefaultDataDir() },
		defText: "$XDG_DATA_HOME/toolhost, else ~/.local/share/toolhost",
		usage:   "data directory: compilation cache and host state",
		doc: `Where the host keeps its state: the compilation cache of the plugins
(data_dir/cache), which makes every start after the first one fast, and the directory
store (data_dir/store) unless store.dir says otherwise. Private to this user (0700).`},
	{name: "plugins_dir", flag: "plugins-dir", def: "",
		usage: "where relative plugin paths resolve (default: they name the built-in plugins)",
		doc: `Where relative plugin paths (below) resolve. Empty: a relative path names one of the
built-in plugins, which are embedded in the binary (bash.wasm, editfile.wasm,
grepglob.wasm, screenshot.wasm). A relative plugins_dir is taken from the current
directory.`},
	{name: "plugins", def: func() any { return builtinPlugins() },
		doc: `The plugins to load, in order. A tool name must be unique across them.
  path:   the .wasm file; relative to plugins_dir unless absolute (with no plugins_dir,
          a relative path names a built-in plugin).
  grants: the capabilities the plugin may import: log, sandbox_exec, sandbox_files,
          store (objects under plugins/{name}/ of the store below), capture (screenshots
          of a port inside the sandbox, through the browser). A plugin that imports a
          capability it was not granted is refused at load with one error naming the
          plugin and every import it lacks a grant for (the CLI exits 1).
          ` + "`toolhost plugin inspect FILE.wasm`" + ` shows what a plugin needs.
  env:    the plugin's own configuration, visible to it as environment variables.
Each grant may be narrowed by a scope of the same name (leave it out for all of it):
  sandbox_files: {read: [PATTERNS], write: [PATTERNS]}: the workspace paths it may
          read and write (src/**, docs/*.md; !**/.env refuses, whatever the case). An
          empty or missing list allows nothing. A scoped path never goes through a
          symbolic link.
  sandbox_exec: {programs: [git, ls], max_timeout: 30s, env: [LC_ALL]}: the programs
          it may start (argv[0], exactly; a shell or any program that runs others grants
          everything), the longest timeout (background commands are then refused), the
          variables it may set for them.
  store:  {access: read}: get and list only (default read-write).
  capture: {ports: [3000, 8000]}: the ports it may shoot.
  limits: {memory_mib: 64, call_timeout: 5s, calls_per_minute: 60}: its own (0: the
          limits.* below; no bound on calls).
  secrets: {GITHUB_TOKEN: env:GH_TOKEN, NPM_TOKEN: file:/run/secrets/npm}: variables
          the commands it runs get (never the plugin itself), their values read from
          this process's environment or a file; no value ever appears in a result, a log
          or the audit. Needs sandbox_exec.
A refused host call gets a message for the model, like "policy: plugin editfile may
not write src/main.go (allowed: docs/**)". ` + "`toolhost policy test CASES.yaml`" + ` proves a
policy holds.
Listing plugins here replaces the default list; keep the built-ins you want. Plugins
that are granted sandbox_exec also get the command timeouts the host enforces, in
milliseconds: TOOLHOST_EXEC_TIMEOUT_DEFAULT_MS and TOOLHOST_EXEC_TIMEOUT_MAX_MS (from
limits.exec_timeout_default and limits.exec_timeout_max). The bash plugin's own
TOOLHOST_BASH_MAX_TIMEOUT (seconds), set in its env, can only lower its maximum, and
so does the plugin's own sandbox_exec.max_timeout.
No environment variable or flag; set it here.`},
	{name: "project", flag: "project", def: "default",
		usage: "project whose snapshots and screenshots are used",
		doc: `The project whose snapshots and screenshots sessions and the commands use: 1 to 128
letters, digits, '.', '_' or '-', starting with a letter or digit.`},

	{name: "store.kind", flag: "store", def: "dir",
		usage: "object store for snapshots and screenshots: dir or s3",
		doc: `dir: a directory on this machine, no setup. s3: AWS S3 or any S3-compatible store;
credentials come from the AWS SDK's standard chain (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, ~/.aws, an instance role...), never from this file.`},
	{name: "store.dir", flag: "store-dir", def: "", defText: `"" (data_dir/store)`,
		usage: "directory store's root (default data_dir/store)",
		doc:   `The directory store's root.`},
	{name: "store.public_base", flag: "store-public-base", def: "",
		usage: "public origin (CDN) that serves the store's keys, for screenshot URLs",
		doc: `The public origin (a CDN) that serves the store's keys. When set, a screenshot's URL
is public_base/key; otherwise it is a presigned S3 URL (valid 7 days) or, for the
directory store, the image's file path.`},
	{name: "store.s3.bucket", flag: "s3-bucket", def: "",
		usage: "S3 bucket (store s3)",
		doc:   `Required when kind is s3.`},
	{name: "store.s3.region", flag: "s3-region", def: "", defText: `"" (the AWS SDK's, else us-east-1)`,
		usage: "S3 region (default: the AWS SDK's, else us-east-1)",
		doc:   `The region of the bucket; by default the SDK's (AWS_REGION, ~/.aws/config).`},
	{name: "store.s3.endpoint", flag: "s3-endpoint", def: "", defText: `"" (AWS)`,
		usage: "S3-compatible endpoint URL (default: AWS)",
		doc:   `An S3-compatible endpoint such as http://127.0.0.1:7070, instead of AWS.`},
	{name: "store.s3.path_style", flag: "s3-path-style", def: false,
		usage: "address buckets as endpoint/bucket (most S3-compatible servers)",
		doc:   `Address buckets as endpoint/bucket/key (most S3-compatible servers need it).`},
	{name: "store.s3.create_bucket", flag: "s3-create-bucket", def: false,
		usage: "create the bucket when a request finds it missing",
		doc: `Create the bucket the first time a request finds it missing (a new S3-compatible
server, a test). Off, a missing bucket fails with one line that names it and says how to
fix it.`},
	{name: "store.s3.checksums", flag: "s3-checksums", def: "when_supported",
		usage: "request checksums: when_supported or when_required",
		doc: `when_supported (the SDK's default) or when_required, for S3-compatible stores that
refuse the newer checksum headers.`},

	{name: "snapshot.keep", flag: "snapshot-keep", def: 5,
		usage: "snapshots kept per project (the newest)",
		doc:   `How many snapshots per project retention keeps (the newest); negative keeps all.`},
	{name: "snapshot.excludes", flag: "snapshot-excludes", def: func() any { return slices.Clone(archive.DefaultExcludes) },
		usage: "base names left out of snapshots (comma-separated)",
		doc: `Base names left out at any depth: what can be recreated. [] leaves nothing out.
The variable and the flag take a comma-separated list.`},
	{name: "snapshot.retries", flag: "snapshot-retries", def: 3,
		usage: "retries of a failed snapshot upload or download (0: none)",
		doc:   `How many times a failed upload or download is retried, with backoff (0 to 20; 0: none).`},

	{name: "session.ttl", flag: "session-ttl", def: time.Hour,
		usage:   "how long a sandbox lives unless extended",
		aliases: []Alias{{Name: "sandbox.timeout", Flag: "sandbox-timeout"}},
		doc:     `How long a sandbox lives unless extended, and each extension.`},
	{name: "session.keepalive_margin", flag: "keepalive-margin", def: 5 * time.Minute,
		usage: "extend or rotate a sandbox when less than this is left",
		doc:   `With less than this left, the session extends the sandbox or rotates it. Less than ttl.`},
	{name: "session.last_call_margin", flag: "last-call-margin", def: time.Duration(0),
		defText: "0 (half of keepalive_margin)",
		usage:   "rotate with the best snapshot there is when this little is left and saves fail",
		doc: `While saves fail, a session keeps its sandbox (it holds the only copy of the work) and
tries again; when this little is left before an end it cannot extend, it rotates all the
same with the best snapshot it can make (the workspace handed over, or an archive kept
on this host until the store takes it), and says so at error level. 0: half of
keepalive_margin; otherwise less than keepalive_margin.`},
	{name: "session.max_lifetime", flag: "session-max-lifetime", def: 24 * time.Hour,
		usage:   "the longest one sandbox may live; sessions rotate before it",
		aliases: []Alias{{Name: "sandbox.max_lifetime", Flag: "sandbox-max-lifetime"}},
		doc:     `The longest one sandbox may live; at least ttl.`},

	{name: "lease.enabled", flag: "lease", def: true,
		usage: "take the project's lease in the store while a session runs (--lease=false: none)",
		doc: `true: a session takes its project's lease in the store before it starts and gives it
up when it closes, so two toolhost processes sharing a store never run one project at
once; the second is refused with "project P is open on host H (since T); close it
there or wait until E". false: no lease (one host per store, or a store that cannot
keep one: a store that ignores conditional writes is found out and logged at the first
session).`},
	{name: "lease.ttl", flag: "lease-ttl", def: 30 * time.Second,
		usage: "how long a project lease lasts without renewal",
		doc: `How long a lease lasts unless renewed: how long a project stays closed to other hosts
after its host died without closing it. The hosts' clocks must agree to well within it.`},
	{name: "lease.renew", flag: "lease-renew", def: 10 * time.Second,
		usage: "how often the holder renews a project lease",
		doc:   `How often the session renews its lease (and the deadline of each store call doing so); less than ttl.`},

	{name: "screenshot.enabled", flag: "screenshots", def: true,
		usage: "take_screenshot and auto-capture (--screenshots=false turns them off)",
		doc:   `false: no browser is used; take_screenshot returns an error that says so.`},
	{name: "screenshot.port", flag: "screenshot-port", def: 0,
		usage: "take_screenshot's default port when no dev server was seen (0: none)",
		doc: `take_screenshot's port when the call names none and the session has seen no dev
server start. 0: none (the call must name one).`},
	{name: "screenshot.idle_wait", flag: "screenshot-idle-wait", def: 3 * time.Second,
		usage: "longest wait for network idle before a page is shot",
		doc:   `The longest wait for the network to go idle; a page still busy then is shot anyway.`},
	{name: "screenshot.chromium", flag: "chromium", def: "", defText: `"" (the first of those present)`,
		usage: "Chromium binary for screenshots (default: Debian's chromium-headless-shell or chromium)",
		doc: `The Chromium binary, an absolute path; by default the first present of
/usr/lib/chromium/chromium-headless-shell, /usr/lib/chromium/chromium,
/usr/bin/chromium-headless-shell, /usr/bin/chromium.`},

	{name: "sandbox.provider", flag: "sandbox-provider", def: "local",
		usage: "sandbox provider by name, or several tried in order (e2b,local)",
		doc: `The sandbox provider, by name. local: bubblewrap on this machine (Debian package
bubblewrap). e2b: E2B's cloud sandboxes (the e2b keys below). Several, comma-separated,
are tried in order for each new sandbox: with e2b,local a session runs on E2B when it
can and here when E2B is unavailable (no API key, not reachable, out of capacity), the
reason logged; an error that is the configuration's (a key E2B refuses, a template too
small) stops there unless e2b.continue_on_error is set.`},
	{name: "sandbox.network", flag: "network", def: "none",
		usage: "sandbox network: none or host",
		doc:   `none: no network at all. host: the host's network.`},
	{name: "sandbox.memory_mib", flag: "sandbox-memory-mib", def: int64(2048),
		usage: "memory per sandbox, MiB, /tmp and /dev/shm included (-1: no limit)",
		doc: `Memory per sandbox, MiB, the pages of its /tmp and /dev/shm included; past it the
kernel kills a process of the sandbox (the command's result says so). Must be more
than tmp_mib + shm_mib. -1: no limit. Enforced by a memory cgroup (v2 when delegated,
else v1).`},
	{name: "sandbox.processes", flag: "sandbox-processes", def: int64(512),
		usage: "processes and threads per sandbox (-1: no limit)",
		doc: `Processes and threads per sandbox (its agent takes about 20). -1: no limit. Enforced
by a pids cgroup.`},
	{name: "sandbox.cpus", flag: "sandbox-cpus", def: 0.0,
		usage: "CPU quota per sandbox in cores (0: all cores)",
		doc:   `CPU quota per sandbox, in cores (1.5: one and a half cores' time); 0: all cores.`},
	{name: "sandbox.tmp_mib", flag: "sandbox-tmp-mib", def: int64(512),
		usage: "size of a sandbox's /tmp, MiB",
		doc:   `Size of the sandbox's private /tmp (tmpfs), MiB: past it, ENOSPC.`},
	{name: "sandbox.shm_mib", flag: "sandbox-shm-mib", def: int64(512),
		usage: "size of a sandbox's /dev/shm, MiB",
		doc:   `Size of the sandbox's private /dev/shm (tmpfs), MiB: past it, ENOSPC.`},
	{name: "sandbox.disk_mib", flag: "sandbox-disk-mib", def: int64(10240),
		usage: "size of a sandbox's private workspace, MiB (-1: no limit)",
		doc: `Size of a private workspace, MiB: each is its own ext4 filesystem on a loop device
(needs root); past it, ENOSPC. A host directory given as the workspace is not
bounded. -1: no limit.`},
	{name: "sandbox.open_files", flag: "sandbox-open-files", def: int64(16384),
		usage: "open files per process in a sandbox",
		doc:   `Open files per process in a sandbox (RLIMIT_NOFILE).`},
	{name: "sandbox.host_uid", flag: "sandbox-host-uid", def: 2100000000,
		usage: "host uid and gid of the sandbox user when toolhost runs as root",
		doc: `When toolhost runs as root, the sandbox user is this unprivileged host uid (and gid),
never root: files a sandbox makes belong to it. Pick one nothing else uses.`},
	{name: "sandbox.run_dir", flag: "run-dir", def: "", defText: `"" ($TMPDIR/toolhost-run-UID)`,
		usage: "private directory of the sandboxes' sockets (default $TMPDIR/toolhost-run-UID)",
		doc: `The private directory of the sandboxes' sockets; must be this user's and writable by
no one else.`},
	{name: "sandbox.workspace_dir", flag: "workspace-dir", def: "", defText: `"" (/var/tmp/toolhost-workspaces-UID)`,
		usage: "directory of the private workspaces (default /var/tmp/toolhost-workspaces-UID)",
		doc: `Where private workspaces live (their volumes, as root): disk-backed, and below
directories anyone may pass through (bubblewrap runs as the sandbox user).`},

	{name: "e2b.api_key", secret: true, def: Secret(""), defText: `"" ($E2B_API_KEY)`,
		doc: `The E2B API key (e2b_...). Empty: the variable E2B_API_KEY, as E2B's own SDKs read it.
Without a key the e2b provider is unavailable ("E2B API key not configured") and a list
such as e2b,local goes on to the next provider. A secret: no flag, and never printed.`},
	{name: "e2b.domain", flag: "e2b-domain", def: "", defText: `"" ($E2B_DOMAIN, else e2b.app)`,
		usage: "E2B's domain (default $E2B_DOMAIN, else e2b.app; a self-hosted cluster's own)",
		doc: `E2B's domain: sandboxes are reached at {port}-{id}.{domain}. e2b.app is the managed
service; a self-hosted E2B cluster has its own.`},
	{name: "e2b.api_url", flag: "e2b-api-url", def: "", defText: `"" ($E2B_API_URL, else https://api.DOMAIN)`,
		usage: "E2B's API (default $E2B_API_URL, else https://api.DOMAIN)",
		doc:   `The control plane's URL, when it is not https://api.{domain}.`},
	{name: "e2b.sandbox_url", flag: "e2b-sandbox-url", def: "", defText: `"" ($E2B_SANDBOX_URL, else each sandbox's own host)`,
		usage: "one URL for all sandbox traffic (default $E2B_SANDBOX_URL)",
		doc: `One URL for all traffic to sandboxes, routed by E2B's E2b-Sandbox-Id and
E2b-Sandbox-Port headers (a proxy of a self-hosted cluster); empty: each sandbox's own
host, https://{port}-{id}.{domain}.`},
	{name: "e2b.template", flag: "e2b-template", def: "", defText: `"" (base, or the smallest known that fits cpu_count and memory_mb)`,
		usage: "E2B template (ID or alias) sandboxes start from (default base)",
		doc: `The template sandboxes start from, an ID or alias: base, or a team's own with its tools
preinstalled. It needs coreutils, GNU tar and gzip (base has them).`},
	{name: "e2b.templates", def: []E2BTemplate{},
		doc: `Templates and their sizes, beyond what E2B's API lists (public templates such as base,
2 CPUs and 512 MB, are known already). cpu_count and memory_mb below pick from them.
No environment variable or flag; set it here.`},
	{name: "e2b.cpu_count", flag: "e2b-cpu-count", def: 0,
		usage: "CPUs per E2B sandbox (0: the template's)",
		doc: `CPUs and memory per E2B sandbox. On E2B they belong to templates: a size picks the
smallest known template that provides it, or fails naming the ones there are. 0: the
template's.`},
	{name: "e2b.memory_mb", flag: "e2b-memory-mb", def: 0,
		usage: "memory per E2B sandbox, MB (0: the template's)",
		doc:   `See cpu_count.`},
	{name: "e2b.plan", flag: "e2b-plan", def: "hobby",
		usage: "E2B plan: hobby or pro (lifetime, concurrency and rate limits)",
		doc: `hobby (sandboxes live at most 1h; 20 at once; 1 creation a second) or pro (24h; 100; 5).
Sessions on E2B keep ttl and max_lifetime within the plan's lifetime; toolhost quota and
the log warn at 80% of a limit.`},
	{name: "e2b.max_lifetime", flag: "e2b-max-lifetime", def: time.Duration(0), defText: "0 (the plan's)",
		usage: "longest life of one E2B sandbox (0: the plan's)",
		doc:   `The longest one E2B sandbox may live, when the team's plan differs from the named one.`},
	{name: "e2b.monthly_cpu_minutes", flag: "e2b-monthly-cpu-minutes", def: 0.0,
		usage: "E2B compute the team means to spend a month, CPU minutes (0: not watched)",
		doc: `The compute the team means to spend in a calendar month, in CPU minutes (sandbox
lifetime times CPUs), e.g. what its credits cover; toolhost quota and the log warn at
80%. 0: not watched.`},
	{name: "e2b.private_previews", flag: "e2b-private-previews", def: false,
		usage: "E2B sandbox ports reachable only with their traffic token",
		doc: `Make a sandbox's ports (other than E2B's own agent's) reachable only with the
sandbox's traffic token; previews and screenshots go through a proxy on this host
that adds it.`},
	{name: "e2b.metadata", def: map[string]string{},
		doc: `Labels added to every E2B sandbox, shown in E2B's dashboard and list; toolhost adds
toolhost: "1", host and project. No environment variable or flag; set it here.`},
	{name: "e2b.request_timeout", flag: "e2b-request-timeout", def: 60 * time.Second,
		usage: "bound of each E2B API request, waits after a 429 included",
		doc:   `The bound of each request to E2B's API, the waits a 429 asks for included.`},
	{name: "e2b.connect_timeout", flag: "e2b-connect-timeout", def: 10 * time.Second,
		usage: "bound of reaching E2B; past it the provider is unavailable",
		doc:   `The bound of reaching E2B; past it the provider is unavailable and a list goes on.`},
	{name: "e2b.continue_on_error", flag: "e2b-continue-on-error", def: false,
		usage: "in a provider list, give way to the next provider on any error",
		doc: `In a list of providers (sandbox.provider: e2b,local), give way to the next one on any
error, not only when a provider is unavailable: a key E2B refuses or a template that
does not exist then also falls back (and is logged), instead of failing the session.`},

	{name: "limits.memory_mib", flag: "memory-mib", def: 128,
		usage: "memory limit per plugin instance, MiB",
		doc: `Linear memory cap of each plugin instance, MiB (1 to 4096). A plugin that exceeds it
fails the call and its instance is discarded.`},
	{name: "limits.call_timeout", flag: "call-timeout", def: 10 * time.Second,
		usage: "deadline for a plugin's own work per call",
		doc: `Deadline for a plugin's own work in one call. Time spent in host functions (running a
command, reading a file) does not count; those have their own bounds.`},
	{name: "limits.pool_size", flag: "pool-size", def: 8,
		usage: "maximum instances per plugin",
		doc:   `The most instances kept per plugin, and so the most concurrent calls into it.`},
	{name: "limits.exec_timeout_default", flag: "exec-timeout", def: 60 * time.Second,
		usage: "default timeout of a sandbox command",
		doc:   `Timeout of a sandbox command run without one (the bash tool's default).`},
	{name: "limits.exec_timeout_max", flag: "exec-timeout-max", def: 600 * time.Second,
		usage: "maximum timeout of a sandbox command",
		doc: `The longest timeout a command may ask for; longer requests are cut to it. Whole
seconds, at least exec_timeout_default.`},
	{name: "limits.read_max_bytes", flag: "read-max-bytes", def: int64(16 << 20),
		usage: "largest file a plugin may read, bytes",
		doc:   `The largest file a plugin may read in one call, bytes (16 MiB).`},
	{name: "limits.exec_output_max_bytes", flag: "exec-output-max-bytes", def: 64 << 10,
		usage: "what a command's stdout and stderr each keep (head and tail), bytes",
		doc: `What a command's stdout and stderr each keep, bytes (64 KiB): the head and the tail,
with the middle dropped and counted, so a flood of output cannot exhaust memory.`},

	{name: "audit.file", flag: "audit-file", def: "", defText: `"" (no audit)`,
		usage: "append a JSON line per host call and tool call to this file (default: no audit)",
		doc: `Where the audit goes: one JSON line per host call a plugin makes (its plugin,
tool, capability, operation, paths or argv, the policy's decision and why, status,
duration and bytes) and one per tool call, appended (the file is made 0600). Empty:
no audit, and no cost. ` + "`toolhost audit`" + ` filters it. It may not lie in a workspace.`},

	{name: "serve.listen", flag: "listen", def: "127.0.0.1:8750",
		usage: "address toolhost serve listens on (MCP at /mcp)",
		doc: `The address toolhost serve listens on: MCP (streamable HTTP) at /mcp, /healthz, and
/metrics (Prometheus text). An address that is not loopback (127.0.0.1, ::1,
localhost) is refused unless tokens are set.`},
	{name: "serve.tokens", def: []ServeToken{},
		doc: `Bearer tokens the server accepts ("Authorization: Bearer TOKEN"), each with the
projects it may open (none listed: any):
  - token: a long random string (openssl rand -hex 32), at least 16 characters
    projects: [shop, blog]
Prefer tokens_file, which keeps them out of this file. No environment variable or
flag; set it here.`},
	{name: "serve.tokens_file", flag: "tokens-file", def: "",
		usage: "file of bearer tokens for toolhost serve: TOKEN [PROJECT...] per line",
		doc: `A file of bearer tokens, one a line: TOKEN [PROJECT...] (the projects it may open;
none: any); # starts a comment. It may not be readable by group or others (chmod 600).
Added to tokens.`},
	{name: "serve.workspaces", def: map[string]string{},
		doc: `Host directories that projects work on directly, instead of their private workspaces:
  workspaces:
    shop: /srv/checkouts/shop
A session of such a project mounts the directory as its workspace (owners kept; a
directory that holds the configuration, the data dir, a plugin or the browser is
refused at start). No environment variable or flag; set it here. toolhost mcp takes
--workspace DIR for its one project.`},
	{name: "serve.max_sessions", flag: "max-sessions", def: 64,
		usage: "most MCP sessions at once (toolhost serve)",
		doc: `The most MCP sessions connected at once, each with its sandbox once it calls a tool; a
client opening one more gets 503 (Retry-After) until one ends.`},
	{name: "serve.idle_timeout", flag: "idle-timeout", def: 15 * time.Minute,
		usage: "end a session idle this long (its work committed, its sandbox closed)",
		doc: `A session that makes no request for this long ends: its workspace is committed and its
sandbox closed. A client that comes back opens a new session, woken from that snapshot.`},
	{name: "serve.max_body_bytes", flag: "max-body-bytes", def: int64(16 << 20),
		usage: "largest HTTP request body toolhost serve reads, bytes",
		doc: `The largest request body the server reads, bytes (16 MiB): a write_file of a larger
file gets 413.`},

	{name: "log_level", flag: "log-level", def: "info",
		usage: "log level: debug, info, warn or error",
		doc:   `debug, info, warn or error. Logs go to stderr; results go to stdout.`},
	{name: "log_format", flag: "log-format", def: "text",
		usage: "log format: text or json (one JSON object a line)",
		doc:   `text (key=value lines) or json (one JSON object a line, for a log collector).`},
}

// sectionTable documents the sections, for the example file.
var sectionTable = []ConfigSection{
	{"store", `The object store that holds snapshots (projects/{project}/snapshots/) and screenshots
(screenshots/{project}/{agent|auto}/).`},
	{"store.s3", ""},
	{"snapshot", `Workspace snapshots: one tar.gz per save, the newest kept per project.`},
	{"session", `The lifetime of the sandboxes a session runs tools in. A session extends its sandbox
while it can; before an end it cannot extend, it saves a snapshot, starts a new sandbox
and moves the work into it (a rotation).`},
	{"lease", `The project lease: an object under projects/{project}/lease/ in the store naming the
host, process and expiry of the session that has the project open.`},
	{"screenshot", `take_screenshot and the captures a session takes on its own (when a dev server starts
listening and after each commit), in Chromium (scripts/setup-browser.sh installs it).`},
	{"sandbox", `The sandboxes (local: bubblewrap with a read-only system root, the workspace at
/home/user, private /tmp, an unprivileged user, a seccomp filter) and what each one may
use. The limits in force, and how each is enforced on this host, are logged when the
provider starts (a limit the host cannot enforce is a warning).`},
	{"e2b", `The E2B provider (sandbox.provider: e2b, or e2b in a list): sandboxes on E2B's fleet,
or on a self-hosted E2B cluster (set domain, and api_url when it is elsewhere). Its
sandboxes are ephemeral: the work lives in the snapshots, restored into a new sandbox
at each rotation. Every sandbox it creates is counted for toolhost quota, in data_dir
(or in the store when it is S3, which several hosts may share). More: docs/E2B.md.`},
	{"limits", `What plugins and commands may use.`},
	{"audit", `A record of what plugins do, for whoever tests or reviews tool policy.`},
	{"serve", `toolhost serve: the tools over MCP (streamable HTTP) for many clients at once. One MCP
session is one session of a project: a sandbox woken from the project's newest snapshot,
committed when the session ends (closed, idle, or the server stopping on SIGTERM).`},
}

// EnvName is the variable of a key: EnvPrefix + the key in upper case, dots as underscores
// (TOOLHOST_LIMITS_MEMORY_MIB).
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// ConfigKeys is the table of every configuration key, in a stable order.
func ConfigKeys() []ConfigKey {
	typ := reflect.ValueOf(&Config{}).Elem()
	out := make([]ConfigKey, 0, len(keyTable))
	for _, k := range keyTable {
		f, err := fieldOf(typ, k.name)
		if err != nil {
			panic(err)
		}
		ck := ConfigKey{Name: k.name, Flag: k.flag, Usage: k.usage, Doc: k.doc, Type: f.Type(),
			Default: k.defText, Derived: k.defText != "", Secret: k.secret}
		if k.flag != "" || k.secret {
			ck.Env = EnvName(k.name)
		}
		if ck.Default == "" {
			ck.Default = yamlValue(k.defaultValue())
		}
		for _, a := range k.aliases {
			a.Env = EnvName(a.Name)
			ck.Aliases = append(ck.Aliases, a)
		}
		out = append(out, ck)
	}
	return out
}

// ConfigSections documents the sections of keys, in the order of the example file.
func ConfigSections() []ConfigSection { return slices.Clone(sectionTable) }

// yamlValue shows a default as YAML would.
func yamlValue(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" {
			return `""`
		}
		return v
	case time.Duration:
		return durationText(v)
	case []string:
		return "[" + strings.Join(v, ", ") + "]"
	case []Plugin:
		return "the built-in plugins"
	case []E2BTemplate:
		if len(v) == 0 {
			return "[]"
		}
	case map[string]string:
		if len(v) == 0 {
			return "{}"
		}
	case Secret:
		return yamlValue(v.String())
	}
	return fmt.Sprint(v)
}

// durationText writes a duration the way people do: 1h, 5m, 90s.
func durationText(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0 && d < time.Hour:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
