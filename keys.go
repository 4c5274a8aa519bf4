package toolhost

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolhost/toolhost/internal/archive"
	"github.com/toolhost/toolhost/internal/builtins"
	"github.com/toolhost/toolhost/internal/host"
	"github.com/toolhost/toolhost/internal/module"
	"github.com/toolhost/toolhost/policy"
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
	// Module names the provider or store that owns the key ("e2b", "s3"); empty for the
	// keys every part shares.
	Module string
	// HostPath: the value is a path on the host that the host reads or writes on its own
	// behalf; CheckWorkspace refuses a workspace that contains it.
	HostPath bool
	// Example is an example value as YAML lines, shown commented out below the key.
	Example string
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

// builtinPlugins is the plugins key's default: every built-in but the opt-in ones, with
// the grants it needs.
func builtinPlugins() []Plugin {
	var out []Plugin
	for _, b := range builtins.Builtins() {
		if b.OptIn {
			continue
		}
		p := Plugin{Path: b.File, Grants: b.Grants}
		if len(b.Programs) > 0 {
			p.Exec = &policy.Exec{Programs: b.Programs}
		}
		out = append(out, p)
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
grepglob.wasm, screenshot.wasm, and webfetch.wasm, which is loaded only when listed). A
relative plugins_dir is taken from the current directory.`},
	{name: "plugins", def: func() any { return builtinPlugins() },
		doc: `The plugins to load, in order. A tool name must be unique across them.
  path:   the .wasm file; relative to plugins_dir unless absolute (with no plugins_dir,
          a relative path names a built-in plugin).
  grants: the capabilities the plugin may import: log, sandbox_exec, sandbox_files,
          store (objects under plugins/{name}/ of the store below), capture (screenshots
          of a port inside the sandbox, through the browser), web (pages of the web,
          fetched by the host through the egress gateway). A plugin that imports a
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
  web:    {allow: [docs.python.org, "*.readthedocs.io"], deny: [...], preset: none,
          ports: [443]}: where it may fetch, in the entries of sandbox egress (names,
          *.wildcards, name:port, CIDRs; deny wins; ports 80 and 443 by default); left
          out, the registries preset. Loopback, private, link-local and metadata
          addresses are refused whatever a name resolves to, after every redirect.
          The built-in webfetch.wasm (tool web_fetch) is opt-in:
          {path: webfetch.wasm, grants: [web, log], web: {allow: [go.dev]}}.
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
	{name: "store.public_base", flag: "store-public-base", def: "",
		usage: "public origin (CDN) that serves the store's keys, for screenshot URLs",
		doc: `The public origin (a CDN) that serves the store's keys. When set, a screenshot's URL
is public_base/key; otherwise it is a presigned S3 URL (valid 7 days) or, for the
directory store, the image's file path.`},

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
	{name: "snapshot.format", flag: "snapshot-format", def: "chunked",
		usage: "how snapshots are stored: chunked (the only storage format)",
		doc: `Snapshots are stored chunked: files cut into content-defined chunks stored once per
store (a save stores what changed; snapshots can be verified, diffed, rewound, forked and
merged). tar.gz, which older versions could store, is still accepted here with a warning and
stores chunked too: the tar.gz snapshots they wrote restore, and a project's are converted
to chunked on its next wake. toolhost snapshot export writes any snapshot as a tar.gz.
Any other value is an error.`},
	{name: "snapshot.grace", flag: "snapshot-grace", def: time.Hour,
		usage: "how long unreferenced chunks stay before collection deletes them",
		doc: `Chunks no snapshot references are deleted by a collection (snapshot gc) only after
staying unreferenced this long, so a host saving meanwhile never loses one. Hosts sharing a
store must keep their clocks within a quarter of it.`},

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
	{name: "session.autosave", flag: "autosave", def: time.Duration(0),
		defText: "0 (off)",
		usage:   "commit the workspace this often, bounding what a crash of this process loses",
		doc: `A period: the session commits its workspace that often (a snapshot labelled
autosave), besides the commits it is asked for. A session whose process dies without
closing it is taken over by the next one to open the project: on E2B it reconnects to the
sandbox, which still holds everything; on the local provider the sandbox died with its
host, and the work since the last commit is lost (the first tool result says what). This
bounds that loss. 0: off; otherwise at least 1s. A commit that finds nothing changed
stores nothing.`},

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
small) stops there unless continue_on_error is set.`},
	{name: "sandbox.continue_on_error", flag: "continue-on-error", def: false,
		aliases: []Alias{{Name: "e2b.continue_on_error", Flag: "e2b-continue-on-error"}},
		usage:   "in a provider list, give way to the next provider on any error",
		doc: `In a list of providers (sandbox.provider: e2b,local), give way to the next one on any
error, not only when a provider is unavailable: a key E2B refuses or a template that
does not exist then also falls back (and is logged), instead of failing the session.`},
	{name: "sandbox.network", flag: "network", def: "egress",
		usage: "sandbox network: egress, none or host",
		doc: `egress: no route anywhere; the sandbox reaches what sandbox.egress allows through the
host's egress gateway (an HTTP proxy, CONNECT and SOCKS5 at 127.0.0.1:3128 inside; every
command gets HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY), and loopback, private,
link-local, metadata and the host's own addresses are refused whatever the policy says.
none: no network at all. host: the host's network, loopback included (trusted work
only: a sandbox with it reaches every service of this machine and its network).
docs/NETWORK.md says what each allows.`},
	{name: "sandbox.egress.preset", flag: "egress-preset", def: "registries",
		usage: "destinations allowed besides sandbox.egress.allow: registries or none",
		doc: `A list of destinations allowed besides allow: registries (npm and yarn, PyPI, the Go
module proxy and checksum database, crates.io, RubyGems, Maven Central, GitHub's clone
and archive hosts: the exact list is in docs/NETWORK.md), or none.`},
	{name: "sandbox.egress.allow", flag: "egress-allow", def: []string{},
		usage: "destinations a sandbox may reach (domain, *.domain, domain:port, CIDR)",
		doc: `Destinations a sandbox may reach besides the preset's: example.com (that name),
*.example.com (every name below it, never example.com itself or evil-example.com),
example.com:8443 (that port only), 203.0.113.0/24 (IP literals in it; a name must be
named), * (every name). Entries without a port apply on sandbox.egress.ports. The
variable and the flag take a comma-separated list.`},
	{name: "sandbox.egress.deny", flag: "egress-deny", def: []string{},
		usage: "destinations refused even when allowed (deny wins)",
		doc: `Destinations refused even when allowed (the same forms; an entry without a port is
refused on every port). A CIDR here refuses the addresses any name resolves to.`},
	{name: "sandbox.egress.ports", flag: "egress-ports", def: []int{80, 443},
		usage: "ports of entries that name no port",
		doc:   `The ports an entry without its own port may be reached on.`},
	{name: "sandbox.egress.max_bytes", flag: "egress-max-bytes", def: int64(4 << 30),
		usage: "bytes a session may move through the gateway, both ways (-1: no bound)",
		doc: `The bytes a session's sandboxes may move through the gateway, both ways together
(4 GiB); past it a download is cut and new requests are refused, saying why. -1: no
bound.`},
	{name: "sandbox.egress.max_conns", flag: "egress-max-conns", def: 256,
		usage: "connections a sandbox may have open through the gateway at once",
		doc: `Connections a sandbox may have open through the gateway at once; one more is refused,
saying why. As many more may wait to send their first byte; past that the oldest of those
is closed.`},
	{name: "sandbox.egress.idle_timeout", flag: "egress-idle-timeout", def: 5 * time.Minute,
		usage: "end a connection with no byte either way for this long",
		doc:   `A connection through the gateway with no byte either way for this long is ended.`},
	{name: "sandbox.egress.resolver", flag: "egress-resolver", def: "system",
		usage: "how the gateway resolves names: system, or a DNS server IP[:PORT]",
		doc: `How the gateway resolves names (sandboxes never do): system (this machine's resolver,
names taken as absolute), or a DNS server's address, IP or IP:PORT, asked directly.`},
	{name: "sandbox.egress.ca_file", flag: "egress-ca-file", def: "",
		usage: "PEM certificates sandboxes and the gateway trust besides the system's",
		doc: `PEM certificates the sandboxes' TLS clients (curl, git, pip, npm, node, Go) trust
besides the system's roots, and the gateway too where it speaks TLS itself (a registry
mirror with a private CA). An absolute path.`},
	{name: "sandbox.egress.inject", def: []EgressInject{},
		doc: `Credentials the gateway adds to the requests of one domain, so the secret never enters
the sandbox (not its environment, files or memory):
  - domain: registry.npmjs.org
    header: Authorization
    secret: env:NPM_AUTH   # or file:/run/secrets/npm; the whole header value
For these domains only, and only on port 443, the gateway terminates TLS with a CA of
the sandbox's own (which the sandbox trusts; it can sign for these domains and nothing
else); every other destination stays an untouched tunnel. No environment variable or
flag; set it here.`},
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

	{name: "limits.memory_mib", flag: "memory-mib", def: 128,
		usage: "memory limit per plugin instance, MiB",
		doc: `Linear memory cap of each plugin instance, MiB (1 to 4096). A plugin that exceeds it
fails the call and its instance is discarded. Each plugin is told its own in
TOOLHOST_MEMORY_LIMIT_MIB (read_file refuses an image that would not fit, saying so).`},
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
duration and bytes) and one per tool call, appended (the file is made 0600). A line is
bounded (a long command or path is cut, and the line's "cut" says how many bytes were
left out); the file rotates at 64 MiB to FILE.1, FILE.2, FILE.3 (the oldest goes), and
several processes may share it. Empty: no audit, and no cost. ` + "`toolhost audit`" + `
filters it. It may not lie in a workspace.`},

	{name: "serve.listen", flag: "listen", def: "127.0.0.1:8750",
		usage: "address toolhost serve listens on (MCP at /mcp)",
		doc: `The address toolhost serve listens on: MCP (streamable HTTP) at /mcp, /healthz, and
/metrics (Prometheus text). An address that is not loopback (127.0.0.1, ::1,
localhost) is refused unless tokens are set.`},
	{name: "serve.tokens", def: []ServeToken{},
		doc: `Bearer tokens the server accepts ("Authorization: Bearer TOKEN"), each with the
projects it may open (none listed: any) and, optionally, a narrowing of what its
sessions' sandboxes may reach (sandbox.egress; it can only take away):
  - token: a long random string (openssl rand -hex 32), at least 16 characters
    projects: [shop, blog]
    egress: {allow: [registry.npmjs.org]}
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
	{name: "serve.daemon_calls", flag: "daemon-calls", def: true,
		usage: "let toolhost call run in this user's session daemon, starting one after a call that found none",
		doc: `A plain toolhost call (no --session, no held session of the project) runs in this
user's session daemon when one answers with the same configuration: it keeps the
plugins loaded, so a call costs a fraction of a process's start. A call that found
none runs in its own process and, once it has printed its result, starts one
(toolhost serve --daemon, exiting after a minute with nothing to do) for the next
call. false: every call runs in its own process and starts nothing that outlives it
(a CI job that must leave no process behind). Held sessions are not affected.`},
	{name: "serve.max_body_bytes", flag: "max-body-bytes", def: int64(16 << 20),
		usage: "largest HTTP request body toolhost serve reads, bytes",
		doc: `The largest request body the server reads, bytes (16 MiB): a write_file of a larger
file gets 413.`},

	{name: "serve.drain", flag: "drain", def: "close",
		usage: "what SIGTERM does with open sessions: close (commit, close the sandbox) or handoff",
		doc: `What toolhost serve does with each open session when it is told to stop (SIGTERM,
SIGINT): close commits the workspace and closes the sandbox; handoff (in a fleet) lets
the call in flight finish, commits, keeps a sandbox that lives apart from this process
(E2B) running, and gives the project's lease up with a handoff record, so the replica
that gets the next request connects to the same sandbox: its background processes (a
dev server) keep running through a deploy. A local sandbox dies with its process: it
is closed either way.`},
	{name: "serve.fleet.advertise", flag: "fleet-advertise", def: "",
		usage: "this replica's URL for the other replicas of its fleet (empty: not in a fleet)",
		doc: `Where the other replicas of the fleet reach this one (http://10.1.2.3:8750, the pod's
address in Kubernetes: TOOLHOST_SERVE_FLEET_ADVERTISE=http://$(POD_IP):8750). Set, the
replica joins the fleet of the replicas that share its store: a request for a project
another replica holds is forwarded there, signed with the fleet secret, and one for a
project whose holder is gone is served here. Empty: not in a fleet, as a single server.`},
	{name: "serve.fleet.secret_file", flag: "fleet-secret-file", def: "",
		usage: "file holding the fleet's shared secret (at least 32 bytes; mode 0600)",
		doc: `A file holding the secret every replica of the fleet shares (at least 32 bytes:
openssl rand -hex 32): replicas sign the requests they forward to each other with it
and prove they know it when probed. Never a client's token. It may not be readable by
group or others. Needed when serve.fleet.advertise is set.`},
	{name: "serve.fleet.peers", flag: "fleet-peers", def: []string{},
		usage: "address ranges (CIDRs) the fleet's replicas are in; a holder elsewhere is not forwarded to",
		doc: `The address ranges (CIDRs: 10.0.0.0/8, fd00::/64) the replicas' advertised addresses
are in. A lease record in the store naming an address outside them is not trusted: no
request is forwarded there. Empty: the advertised address's own host only, which is
what a fleet of replicas on one machine needs.`},
	{name: "serve.fleet.orphan_after", flag: "fleet-orphan-after", def: 15 * time.Minute,
		usage: "how long a project's sandboxes wait for a replica when nobody holds the project, before they are killed",
		doc: `When nobody holds a project (its holder died, or handed it over at a drain and no request
for it came since), its sandboxes wait this long for a replica to reconnect to them
(the next request for the project, on any replica, does); after it, any replica of the
fleet that finds them kills them (each replica looks every third of this, at most every
minute), taking the project's lease while it does. Only sandboxes the fleet's replicas
started are judged: they carry the fleet's name (toolhost_fleet) from the store. Work
committed is in the snapshots; what was not, and the background processes, are lost
with the sandbox: session.autosave bounds that. toolhost fleet status lists each
sandbox and when it becomes an orphan.`},

	{name: "registry.keys", flag: "registry-keys", def: []string{},
		usage: "public keys (PEM files) trusted to sign the plugins installed from registries (comma-separated)",
		doc: `The public keys (PEM files, ECDSA P-256, as cosign and ` + "`toolhost plugin sign --generate-key`" + `
make them) whose signatures ` + "`toolhost plugin add`" + ` and ` + "`upgrade`" + ` accept on a plugin pulled
from an OCI registry. A plugin signed by no key here is refused.`},
	{name: "registry.allow_unsigned", flag: "registry-allow-unsigned", def: []string{},
		usage: "registries (host:port) whose unsigned plugins are accepted (comma-separated)",
		doc: `The registries (host or host:port, as in the reference) whose unsigned plugins are
installed all the same: a registry of your own on a trusted network. Empty: every
plugin must be signed.`},
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
	{"snapshot", `Workspace snapshots: chunked, a save stores what changed; the newest kept per project.`},
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
	{"sandbox.egress", `The way out of a sandbox with sandbox.network egress: the gateway's policy and bounds.
Every connection is audited (audit.file: cap egress).`},
	{"limits", `What plugins and commands may use.`},
	{"audit", `A record of what plugins do, for whoever tests or reviews tool policy.`},
	{"registry", `Plugins installed from OCI registries (toolhost plugin add REF): the signers trusted.
What was installed is pinned in toolhost.lock beside this file.`},
	{"serve", `toolhost serve: the tools over MCP (streamable HTTP) for many clients at once. One MCP
session is one session of a project: a sandbox woken from the project's newest snapshot,
committed when the session ends (closed, idle, or the server stopping on SIGTERM).`},
}

// EnvName is the variable of a key: EnvPrefix + the key in upper case, dots as underscores
// (TOOLHOST_LIMITS_MEMORY_MIB).
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// ConfigKeys is the table of every configuration key, in a stable order: the keys every
// part shares, with the keys of each registered module (provider or store) after the
// shared keys of its section (the local provider's after sandbox.*, the s3 store's after
// store.*, a section of a module's own after the sandbox section).
func ConfigKeys() []ConfigKey {
	cfg := DefaultConfig()
	v := reflect.ValueOf(&cfg).Elem()
	out := make([]ConfigKey, 0, len(keyTable))
	for _, k := range keyTable {
		f, err := fieldOf(v, k.name)
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
	for _, m := range moduleRefs() {
		var keys []ConfigKey
		sec := reflect.ValueOf(cfg.section(m)).Elem()
		for _, mk := range m.keys {
			f, err := fieldOf(sec, strings.TrimPrefix(mk.Name, m.prefix))
			if err != nil {
				panic(fmt.Sprintf("toolhost: module %s: %v", m.name, err))
			}
			ck := ConfigKey{Name: mk.Name, Flag: mk.Flag, Usage: mk.Usage, Doc: mk.Doc, Type: f.Type(),
				Default: mk.Default, Derived: mk.Default != "", Secret: mk.Secret, Module: m.name, HostPath: mk.HostPath, Example: mk.Example}
			if !mk.FileOnly {
				ck.Env = EnvName(mk.Name)
			}
			if ck.Default == "" {
				ck.Default = yamlValue(f.Interface())
			}
			for _, a := range mk.Aliases {
				ck.Aliases = append(ck.Aliases, Alias{Name: a, Env: EnvName(a), Flag: strings.NewReplacer(".", "-", "_", "-").Replace(a)})
			}
			keys = append(keys, ck)
		}
		out = slices.Insert(out, insertAt(out, m.prefix), keys...)
	}
	return out
}

// insertAt is where the keys of a module with prefix go in the table: after the last key
// of the same top section, else after the sandbox section.
func insertAt(keys []ConfigKey, prefix string) int {
	top, _, _ := strings.Cut(prefix, ".")
	last := -1
	for i, k := range keys {
		if t, _, _ := strings.Cut(k.Name, "."); t == top {
			last = i
		}
	}
	if last < 0 {
		for i, k := range keys {
			if strings.HasPrefix(k.Name, "sandbox.") {
				last = i
			}
		}
	}
	return last + 1
}

// ConfigSections documents the sections of keys, in the order of the example file: the
// shared ones with each module's after the section its keys follow.
func ConfigSections() []ConfigSection {
	out := slices.Clone(sectionTable)
	for _, m := range moduleRefs() {
		for _, sec := range m.sections {
			if slices.ContainsFunc(out, func(s ConfigSection) bool { return s.Name == sec.Name }) {
				continue
			}
			top, _, _ := strings.Cut(sec.Name, ".")
			at := slices.IndexFunc(out, func(s ConfigSection) bool { return s.Name == top })
			if at < 0 {
				at = slices.IndexFunc(out, func(s ConfigSection) bool { return s.Name == "sandbox" })
			}
			out = slices.Insert(out, at+1, ConfigSection{Name: sec.Name, Doc: sec.Doc})
		}
	}
	return out
}

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
	case []EgressInject:
		if len(v) == 0 {
			return "[]"
		}
	case []int:
		out := make([]string, len(v))
		for i, n := range v {
			out[i] = fmt.Sprint(n)
		}
		return "[" + strings.Join(out, ", ") + "]"
	case map[string]string:
		if len(v) == 0 {
			return "{}"
		}
	case Secret:
		return yamlValue(v.String())
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.Len() == 0 {
		return "[]"
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

// keyField finds the field of a key: in Config for the shared keys, in its module's
// configuration for a module's.
func (c *Config) keyField(name string) (reflect.Value, error) {
	if m, ok := moduleOfKey(name); ok {
		return fieldOf(reflect.ValueOf(c.section(m)).Elem(), strings.TrimPrefix(name, m.prefix))
	}
	if !slices.ContainsFunc(keyTable, func(k key) bool { return k.name == name }) {
		return reflect.Value{}, fmt.Errorf("config: no key %q", name)
	}
	return fieldOf(reflect.ValueOf(c).Elem(), name)
}

// Get returns the value of a key, by its dotted name ("sandbox.memory_mib",
// "e2b.api_key"), as the key's own type.
func (c *Config) Get(key string) (any, error) {
	f, err := c.keyField(key)
	if err != nil {
		return nil, err
	}
	return f.Interface(), nil
}

// Set sets a key by its dotted name to v: a value of the key's type (or one convertible
// to it), or, for a key of a string, number, boolean, duration or list of strings, a
// string written as its variable takes it ("30s", "true", "a,b"). Validate checks the
// result as a whole.
func (c *Config) Set(key string, v any) error {
	f, err := c.keyField(key)
	if err != nil {
		return err
	}
	rv := reflect.ValueOf(v)
	switch {
	case !rv.IsValid():
		f.Set(reflect.Zero(f.Type()))
		return nil
	case rv.Type().AssignableTo(f.Type()):
		f.Set(rv)
		return nil
	case rv.Kind() == reflect.String && f.Type() != reflect.TypeOf(Secret("")) && f.Kind() != reflect.String:
		return setFromString(f, key, rv.String())
	case rv.Type().ConvertibleTo(f.Type()) && rv.Kind() == f.Kind():
		f.Set(rv.Convert(f.Type()))
		return nil
	}
	return fmt.Errorf("config: %s: want a %s, got %T", key, f.Type(), v)
}

// setFromString parses s into f as a variable's value is parsed.
func setFromString(f reflect.Value, key, s string) error {
	bad := func(err error) error { return fmt.Errorf("config: %s: not a valid %s: %q (%v)", key, f.Type(), s, err) }
	switch {
	case f.Type() == reflect.TypeOf(time.Duration(0)):
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return bad(err)
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return bad(err)
		}
		f.SetBool(b)
	case f.CanInt():
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return bad(err)
		}
		f.SetInt(n)
	case f.CanFloat():
		n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return bad(err)
		}
		f.SetFloat(n)
	case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String:
		var list []string
		for item := range strings.SplitSeq(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				list = append(list, item)
			}
		}
		f.Set(reflect.ValueOf(list).Convert(f.Type()))
	default:
		return fmt.Errorf("config: %s: a %s cannot be set from a string", key, f.Type())
	}
	return nil
}

// DefaultConfig is the configuration of ConfigKeys' defaults: the built-in plugins, the
// local sandbox provider, a directory store under the data dir.
func DefaultConfig() Config {
	var c Config
	for _, m := range moduleRefs() {
		c.section(m)
	}
	v := reflect.ValueOf(&c).Elem()
	for _, k := range keyTable {
		f, err := fieldOf(v, k.name)
		if err != nil {
			panic(err) // TestConfigKeys keeps the table and the struct in step
		}
		d := k.defaultValue()
		if d == nil {
			continue
		}
		f.Set(reflect.ValueOf(d).Convert(f.Type()))
	}
	return c
}

// fieldOf finds the field of v (a Config) that the dotted key names.
func fieldOf(v reflect.Value, key string) (reflect.Value, error) {
	for part := range strings.SplitSeq(key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, fmt.Errorf("config key %s: %s is not a section", key, part)
		}
		found := false
		for i := range v.NumField() {
			if v.Type().Field(i).Tag.Get("key") == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, fmt.Errorf("config key %s: no field for %q", key, part)
		}
	}
	return v, nil
}

// moduleOfKey finds the module that owns a key.
func moduleOfKey(key string) (moduleRef, bool) {
	for _, m := range moduleRefs() {
		if slices.ContainsFunc(m.keys, func(k module.Key) bool { return k.Name == key }) {
			return m, true
		}
	}
	return moduleRef{}, false
}
