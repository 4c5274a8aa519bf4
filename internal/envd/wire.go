// Package envd is the wire of the sandbox data plane: the paths, headers, messages, error
// kinds and framing that a client (package client) and an in-sandbox agent (package agent)
// exchange. They speak a subset of E2B envd's protocol — plain HTTP for /health and /files, Connect
// (JSON codec) for process.Process and filesystem.Filesystem — so one client serves both
// the local provider and, later, E2B's own envd.
//
// Toolhost extensions travel in request headers, query parameters and extra JSON fields
// that a real envd ignores and that an unknown-field-tolerant client skips:
//   - header Toolhost-Max-Output-Bytes caps each output stream at the source (head, then
//     the tail with a DataEvent.ToolhostDropped count before it);
//   - header Toolhost-Kill-On-Disconnect kills a foreground process's group when its
//     stream is dropped (the client's Exec sends it; envd's default keeps it running);
//   - header Toolhost-Background sends a process's output to a log file, named in
//     StartEvent.ToolhostLogPath, and ends the stream right after the start event;
//   - query toolhost_max_bytes on GET /files refuses larger files with 413;
//   - ListDirRequest.ToolhostSkip/ToolhostLimit and ListDirResponse.ToolhostTruncated;
//   - error bodies carry toolhostKind naming the sandbox sentinel error.
//
// And two endpoints of its own, under /toolhost/, that a real envd answers with 404:
//   - GET /toolhost/ports lists the TCP ports that processes of the sandbox listen on
//     (PortsResponse): LISTEN sockets of /proc/net/tcp{,6} whose inode is held open by a
//     process visible in the sandbox's pid namespace, so that with the host's network the
//     host's own listeners, which share the table, are left out;
//   - GET /toolhost/dial?port=N with "Connection: Upgrade" and "Upgrade: toolhost-tcp"
//     reaches such a port: the agent checks that a sandbox process listens on N (else 404
//     with toolhostKind port_closed), connects from inside the sandbox to 127.0.0.1:N or
//     [::1]:N and nothing else, answers "101 Switching Protocols" and from then on the
//     connection carries the raw TCP byte stream both ways (see ListeningPort.Dial).
package envd

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"time"

	"github.com/toolhost/toolhost/core/sandbox"
)

// Paths of the endpoints served and called.
const (
	PathHealth         = "/health"
	PathFiles          = "/files"
	PathProcessStart   = "/process.Process/Start"
	PathProcessSignal  = "/process.Process/SendSignal"
	PathProcessList    = "/process.Process/List"
	PathFilesystemStat = "/filesystem.Filesystem/Stat"
	PathFilesystemList = "/filesystem.Filesystem/ListDir"
	PathFilesystemMkd  = "/filesystem.Filesystem/MakeDir"
	PathFilesystemRm   = "/filesystem.Filesystem/Remove"

	// Toolhost extensions (no envd counterpart).
	PathPorts     = "/toolhost/ports"
	PathDial      = "/toolhost/dial"
	PathWorkspace = "/toolhost/workspace" // POST: open the workspace again (a pooled sandbox's, just attached)
	PathClaim     = "/toolhost/claim"     // POST: a warm-pool agent's one claim (ClaimRequest)
	// PathEgressRelay (POST, EgressRelayRequest) moves a relaying agent's egress to
	// another host's relay: the host that takes the sandbox over.
	PathEgressRelay = "/toolhost/egress-relay"
	// PathTrust (POST, TrustRequest) gives the sandbox certificates to trust.
	PathTrust = "/toolhost/trust"
)

// ClaimRequest is the body of PathClaim: the host that claimed a warm-pool pod gives its
// agent the sandbox's own access token (and environment), authenticated by the pool's
// token, once. Pod names the pod the host meant, which the agent checks against its own
// name: a claim sent to a stale address claims nothing.
type ClaimRequest struct {
	Pod   string            `json:"pod"`
	Token string            `json:"token"`
	Env   map[string]string `json:"env,omitempty"`
}

// TrustRequest is the body of PathTrust: PEM certificates the sandbox's TLS clients trust
// besides the image's (sandbox.egress.ca_file, the egress gateway's CA for injected
// domains). The agent writes them, and a bundle of the image's own and them, in TrustDir;
// the variables of TrustEnv point there.
type TrustRequest struct {
	PEM string `json:"pem"`
}

// Where a remote sandbox's agent writes its trust (TrustRequest), and the bounds of it.
const (
	TrustDir    = "/tmp/toolhost-trust"
	TrustBundle = "ca-bundle.crt"
	TrustExtra  = "extra-ca.pem"
	MaxTrust    = 1 << 20
)

// TrustEnv are the variables that point a sandbox's TLS clients at the trust written in
// TrustDir (OpenSSL and Go, Python's requests and pip, curl, git: the bundle; Node: the
// extra certificates, which it adds to its own).
func TrustEnv() map[string]string {
	bundle := TrustDir + "/" + TrustBundle
	env := map[string]string{"NODE_EXTRA_CA_CERTS": TrustDir + "/" + TrustExtra}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
		env[k] = bundle
	}
	return env
}

// Headers and query parameters.
const (
	HeaderTimeoutMs      = "Connect-Timeout-Ms"
	HeaderProtocol       = "Connect-Protocol-Version"
	HeaderMaxOutputBytes = "Toolhost-Max-Output-Bytes"
	HeaderBackground     = "Toolhost-Background"
	HeaderKillOnClose    = "Toolhost-Kill-On-Disconnect"
	// HeaderAccessToken carries the agent's access token (envd's own header for it).
	HeaderAccessToken = "X-Access-Token"
	QueryMaxBytes     = "toolhost_max_bytes"
	// Guarded /files (sandbox.FileGuard), toolhost extensions a real envd ignores, so a
	// client sends them only to this agent: no link at any part of the path; a write only
	// if the file's version (hex SHA-256 of its contents) is this, or only if it is absent.
	QueryNoLinks   = "toolhost_no_links"
	QueryIfVersion = "toolhost_if_version"
	QueryIfAbsent  = "toolhost_if_absent"
	QueryPort      = "port"         // of PathDial
	UpgradeTCP     = "toolhost-tcp" // the Upgrade protocol of PathDial

	ContentJSON       = "application/json"
	ContentStreamJSON = "application/connect+json"
	ContentOctet      = "application/octet-stream"
)

// Int64 is a protojson 64-bit integer: written as a JSON string, read from a string or a
// number.
type Int64 int64

// MarshalJSON writes the decimal string form.
func (i Int64) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(i), 10) + `"`), nil
}

// UnmarshalJSON accepts "123" and 123.
func (i *Int64) UnmarshalJSON(b []byte) error {
	s := string(bytes.Trim(b, `"`))
	if s == "" || s == "null" {
		*i = 0
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("parse int64 %q: %w", b, err)
	}
	*i = Int64(v)
	return nil
}

// ProcessConfig is what to run.
type ProcessConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// StartRequest starts a process. Stdin absent means true in envd; this agent never
// connects stdin (it is /dev/null) and the client always sends false.
type StartRequest struct {
	Process ProcessConfig `json:"process"`
	Tag     string        `json:"tag,omitempty"`
	Stdin   *bool         `json:"stdin,omitempty"`
}

// StartResponse carries one event of a started process.
type StartResponse struct {
	Event ProcessEvent `json:"event"`
}

// ProcessEvent is a oneof: exactly one member is set.
type ProcessEvent struct {
	Start     *StartEvent `json:"start,omitempty"`
	Data      *DataEvent  `json:"data,omitempty"`
	End       *EndEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

// StartEvent is always the first event.
type StartEvent struct {
	Pid uint32 `json:"pid"`
	// ToolhostLogPath: where a background process writes its output (extension).
	ToolhostLogPath string `json:"toolhostLogPath,omitempty"`
}

// DataEvent is a chunk of one stream.
type DataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
	// ToolhostDropped (extension): bytes of this stream the agent dropped right before this
	// chunk. A client that ignores it still sees head followed by tail.
	ToolhostDropped Int64 `json:"toolhostDropped,omitempty"`
}

// EndEvent reports how the process ended.
type EndEvent struct {
	ExitCode int32  `json:"exitCode,omitempty"`
	Exited   bool   `json:"exited,omitempty"`
	Status   string `json:"status,omitempty"`
	Error    string `json:"error,omitempty"`
}

// ProcessSelector picks a process by pid or tag.
type ProcessSelector struct {
	Pid uint32 `json:"pid,omitempty"`
	Tag string `json:"tag,omitempty"`
}

// Signal names accepted by SendSignal.
const (
	SignalTerm = "SIGNAL_SIGTERM"
	SignalKill = "SIGNAL_SIGKILL"
)

// Enum is a protojson enum: written as its name, read from a name or a number.
type Enum string

// UnmarshalJSON accepts a name or a number (kept as its decimal text).
func (e *Enum) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*e = Enum(s)
		return nil
	}
	*e = Enum(string(b))
	return nil
}

// SendSignalRequest signals a process (this agent signals its whole process group).
type SendSignalRequest struct {
	Process ProcessSelector `json:"process"`
	Signal  Enum            `json:"signal"`
}

// ListRequest lists running processes.
type ListRequest struct{}

// ListResponse holds the running processes.
type ListResponse struct {
	Processes []ProcessInfo `json:"processes,omitempty"`
}

// ProcessInfo describes one running process.
type ProcessInfo struct {
	Config ProcessConfig `json:"config"`
	Pid    uint32        `json:"pid"`
	Tag    string        `json:"tag,omitempty"`
}

// PortsResponse is the answer of GET /toolhost/ports (extension).
type PortsResponse struct {
	Ports []ListeningPort `json:"ports"`
}

// ListeningPort is one TCP port in LISTEN state held by a process of the sandbox: the
// type of sandbox.PortLister, which the agent's answer is.
type ListeningPort = sandbox.ListeningPort

// File types of EntryInfo.
const (
	FileTypeFile    = "FILE_TYPE_FILE"
	FileTypeDir     = "FILE_TYPE_DIRECTORY"
	FileTypeSymlink = "FILE_TYPE_SYMLINK"
)

// EntryInfo describes a filesystem entry.
type EntryInfo struct {
	Name          string     `json:"name"`
	Type          Enum       `json:"type,omitempty"`
	Path          string     `json:"path"`
	Size          Int64      `json:"size,omitempty"`
	Mode          uint32     `json:"mode,omitempty"`
	Permissions   string     `json:"permissions,omitempty"`
	ModifiedTime  *time.Time `json:"modifiedTime,omitempty"`
	SymlinkTarget *string    `json:"symlinkTarget,omitempty"`
}

// PathRequest is the request of Stat, MakeDir and Remove.
type PathRequest struct {
	Path string `json:"path"`
	// ToolhostNoLinks: refuse a symbolic link at any part of the path, the last included
	// (sandbox.FileGuard.NoLinks; extension, only this project's agent knows it).
	ToolhostNoLinks bool `json:"toolhostNoLinks,omitempty"`
	// ToolhostFileOnly (Remove): remove one entry that is not a directory, never
	// recursively; a directory is refused (extension).
	ToolhostFileOnly bool `json:"toolhostFileOnly,omitempty"`
}

// EntryResponse is the response of Stat and MakeDir.
type EntryResponse struct {
	Entry EntryInfo `json:"entry"`
}

// ListDirRequest lists a directory to a depth (0 means 1).
type ListDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth,omitempty"`
	// ToolhostSkip: directory base names not to descend into (extension).
	ToolhostSkip []string `json:"toolhostSkip,omitempty"`
	// ToolhostLimit: stop after this many entries (extension).
	ToolhostLimit uint32 `json:"toolhostLimit,omitempty"`
	// ToolhostNoLinks: as in PathRequest; below the listed directory no link is
	// followed anyway (extension).
	ToolhostNoLinks bool `json:"toolhostNoLinks,omitempty"`
}

// ListDirResponse holds the entries. This project's agent streams it: entries are written
// as they are found (in walk order, not sorted), so a long listing keeps the client's
// progress bound fed; a failure after the first entry ends it with ToolhostError.
type ListDirResponse struct {
	Entries           []EntryInfo   `json:"entries,omitempty"`
	ToolhostTruncated bool          `json:"toolhostTruncated,omitempty"`
	ToolhostError     *ConnectError `json:"toolhostError,omitempty"`
}

// Empty is a message without fields; it encodes as {}.
type Empty struct{}

// ConnectError is the Connect error body (unary) and EndStreamResponse.error (stream). The
// /files endpoints use the same shape with an integer code (see FilesError).
type ConnectError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
	// ToolhostKind names the sandbox sentinel (not_found, is_dir, ...); extension.
	ToolhostKind string `json:"toolhostKind,omitempty"`
}

// FilesError is the JSON error body of /files.
type FilesError struct {
	Code         int    `json:"code"`
	Message      string `json:"message"`
	ToolhostKind string `json:"toolhostKind,omitempty"`
}

// EndStreamResponse closes a server stream: {} on success.
type EndStreamResponse struct {
	Error    *ConnectError       `json:"error,omitempty"`
	Metadata map[string][]string `json:"metadata,omitempty"`
}

// Connect error codes used here.
const (
	CodeCanceled         = "canceled"
	CodeUnknown          = "unknown"
	CodeInvalidArgument  = "invalid_argument"
	CodeDeadlineExceeded = "deadline_exceeded"
	CodeNotFound         = "not_found"
	CodeAlreadyExists    = "already_exists"
	CodePermissionDenied = "permission_denied"
	CodeResourceExhaust  = "resource_exhausted"
	CodeFailedPrecond    = "failed_precondition"
	CodeOutOfRange       = "out_of_range"
	CodeUnimplemented    = "unimplemented"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
	CodeUnauthenticated  = "unauthenticated"
)

// httpStatus maps a Connect code to its HTTP status (Connect protocol table).
func HTTPStatus(code string) int {
	switch code {
	case CodeCanceled:
		return 499
	case CodeInvalidArgument, CodeFailedPrecond, CodeOutOfRange:
		return 400
	case CodeDeadlineExceeded:
		return 504
	case CodeNotFound:
		return 404
	case CodeAlreadyExists:
		return 409
	case CodePermissionDenied:
		return 403
	case CodeResourceExhaust:
		return 429
	case CodeUnimplemented:
		return 501
	case CodeUnavailable:
		return 503
	case CodeUnauthenticated:
		return 401
	default:
		return 500
	}
}

// codeFromHTTP infers a Connect code when a body is not a Connect error (a proxy answered).
func CodeFromHTTP(status int) string {
	switch status {
	case 400:
		return CodeInternal
	case 401:
		return CodeUnauthenticated
	case 403:
		return CodePermissionDenied
	case 404:
		return CodeUnimplemented
	case 429, 502, 503, 504:
		return CodeUnavailable
	default:
		return CodeUnknown
	}
}

// Envelope flags.
const (
	FlagCompressed = 0x01
	FlagEndStream  = 0x02
)

// maxEnvelope bounds one message read from the wire.
const MaxEnvelope = 16 << 20

// writeEnvelope frames one message.
func WriteEnvelope(w io.Writer, flags byte, payload []byte) error {
	var hdr [5]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// readEnvelope reads one framed message.
func ReadEnvelope(r io.Reader) (flags byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxEnvelope {
		return 0, nil, fmt.Errorf("envelope of %d bytes exceeds %d", n, MaxEnvelope)
	}
	if hdr[0]&FlagCompressed != 0 {
		return 0, nil, errors.New("compressed envelopes are not supported")
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("read envelope payload: %w", io.ErrUnexpectedEOF)
	}
	return hdr[0], payload, nil
}

func FileInfo(e EntryInfo, name string) sandbox.FileInfo {
	mode := fs.FileMode(e.Mode) & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	switch e.Type {
	case FileTypeDir, "2":
		mode |= fs.ModeDir
	case FileTypeSymlink, "3":
		mode |= fs.ModeSymlink
	case FileTypeFile, "1":
	default:
		mode |= fs.FileMode(e.Mode) & fs.ModeType
	}
	fi := sandbox.FileInfo{Path: name, Mode: mode, Size: int64(e.Size)}
	if e.ModifiedTime != nil {
		fi.ModTime = *e.ModifiedTime
	}
	return fi
}

// TokenMatches reports whether got is the access token want, in time that does not depend
// on where they differ.
func TokenMatches(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}
