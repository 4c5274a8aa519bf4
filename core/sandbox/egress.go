package sandbox

import "net"

// Egress is how a sandbox with NetworkEgress reaches the network: through the host's
// egress gateway, which allows what Policy names and refuses the rest. A provider whose
// sandboxes run on this machine (local) hands each connection of the sandbox to a door of
// Gateway; a provider whose sandboxes run elsewhere (E2B) compiles Policy to what its
// platform enforces, and says once what it cannot.
type Egress struct {
	// Policy is what the sandbox may reach, as configured (sandbox.egress.*), narrowed
	// for the session.
	Policy EgressPolicy
	// Gateway opens the host's side of each sandbox. Nil for a provider that enforces
	// Policy itself.
	Gateway EgressGateway
	// Trust is PEM certificates the sandbox's TLS clients trust besides the system's
	// (sandbox.egress.ca_file: a mirror with a private CA). The door's own CA (credential
	// injection) is added to it.
	Trust []byte
}

// EgressPolicy is a destination policy as configured. Its entries are names, *.name
// wildcards, name:port, CIDRs and CIDR:port; Deny wins over Allow; entries without a port
// apply on Ports. Preset names a list of destinations added to Allow ("registries",
// "none").
type EgressPolicy struct {
	Preset string   `json:"preset,omitempty"`
	Allow  []string `json:"allow,omitempty"`
	Deny   []string `json:"deny,omitempty"`
	Ports  []int    `json:"ports,omitempty"`
}

// EgressGateway opens the gateway's side of a sandbox.
type EgressGateway interface {
	// Open makes the door of sandbox id (the name its connections are audited under).
	// Closing the door ends every connection it serves.
	Open(id string) (EgressDoor, error)
}

// EgressDoor is the gateway's side of one sandbox.
type EgressDoor interface {
	// ServeConn serves one connection the sandbox made to its proxy address (HTTP proxy,
	// CONNECT or SOCKS5) until it ends; it closes conn. command is the Tag of the command
	// that made it, as the provider attributed it ("" when unknown).
	ServeConn(conn net.Conn, command string)
	// CACert is the certificate (PEM) of the CA the sandbox must trust for the domains the
	// gateway injects credentials into; nil when it injects none.
	CACert() []byte
	// Refused returns, once, what the gateway refused to command: one sentence each,
	// written for the model.
	Refused(command string) []string
	// Close ends every connection of the sandbox.
	Close()
}

// EgressReporter is a sandbox whose connections go through the host's egress gateway:
// after a command ran (ExecRequest.Tag), it tells what the gateway refused to it.
type EgressReporter interface {
	EgressRefused(command string) []string
}

// EgressRefused is what the gateway refused to command in sb (through any wrappers), once;
// nil when sb has no gateway.
func EgressRefused(sb Sandbox, command string) []string {
	if r, ok := As[EgressReporter](sb); ok {
		return r.EgressRefused(command)
	}
	return nil
}

// Egress proxy address and environment. Inside a sandbox with NetworkEgress the gateway is
// at 127.0.0.1:EgressPort (the sandbox's own loopback, held by its agent); every command
// gets EgressEnv.
const EgressPort = 3128

// EgressEnv is the environment that points a sandbox's programs at the gateway: curl, git,
// pip, npm and Go read HTTP(S)_PROXY (git's libcurl only the lower-case http_proxy); Node's
// built-in fetch reads them from Node 24 on with NODE_USE_ENV_PROXY=1 (older Node's fetch
// ignores them; npm itself does not use fetch and reads them always). ALL_PROXY is SOCKS5
// with names resolved by the gateway (socks5h).
func EgressEnv() map[string]string {
	const http = "http://127.0.0.1:3128"
	const socks = "socks5h://127.0.0.1:3128"
	const noProxy = "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": http, "http_proxy": http,
		"HTTPS_PROXY": http, "https_proxy": http,
		"ALL_PROXY": socks, "all_proxy": socks,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
		"NODE_USE_ENV_PROXY": "1",
	}
}
