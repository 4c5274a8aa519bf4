// Package fleet lets several toolhost serve replicas that share one store serve any
// project, whichever of them holds it. The store stays the only judge of who holds a
// project (internal/lease); this package is what the replicas say to each other:
//
//   - the registry: each replica keeps a record fleet/replicas/{instance} with its
//     advertised address, renewed every Heartbeat, removed when it stops;
//   - signed requests: a request a replica forwards to the holder of its project carries
//     an HMAC-SHA256 signature made with the fleet's shared secret over the method, the
//     path, the sender and receiver, the client's principal (a token's name, never the
//     token), a time and a nonce, and the body's digest. The receiver refuses a signature
//     it cannot check, one older than MaxSkew, a nonce it has seen, and one meant for
//     another replica;
//   - proof of life: GET /fleet/v1/health?nonce=N answers the replica's instance and an
//     HMAC of the nonce, so a prober knows it reached a replica of this fleet, and which;
//     a refused connection or another instance at a holder's address is proof the holder
//     is gone (Probe), which lets the next replica take its project over before the
//     lease's ttl runs out.
//
// Everything read from the store is data, not trust: a lease record's address is
// forwarded to only when it lies in the fleet's peer ranges, is the address the
// registry has for that instance, and the replica there proves it knows the secret.
package fleet

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/toolhost/toolhost/core/store"
	"github.com/toolhost/toolhost/internal/lease"
	"github.com/toolhost/toolhost/internal/storekeys"
)

// Defaults of Config.
const (
	DefaultHeartbeat = 5 * time.Second
	// MaxSkew is how far a signed request's time may be from the receiver's clock.
	MaxSkew = 60 * time.Second
	// MinSecret is the shortest fleet secret accepted, bytes.
	MinSecret = 32
	// maxRecord bounds what is read of a record from the store.
	maxRecord = 16 << 10
)

// Header names of a signed fleet request.
const (
	HeaderFrom      = "Toolhost-Fleet-From"
	HeaderTo        = "Toolhost-Fleet-To"
	HeaderPrincipal = "Toolhost-Fleet-Principal"
	HeaderTime      = "Toolhost-Fleet-Time"
	HeaderNonce     = "Toolhost-Fleet-Nonce"
	HeaderSignature = "Toolhost-Fleet-Signature"
	// HeaderHop marks a response that a forwarding replica relayed (its value: the
	// instance that served it), for logs and tests.
	HeaderHop = "Toolhost-Fleet-Served-By"
)

// HealthPath is the fleet's proof-of-life endpoint.
const HealthPath = "/fleet/v1/health"

// Errors a caller branches on.
var (
	// ErrUnsigned: a request carries no fleet signature.
	ErrUnsigned = errors.New("not a fleet request")
	// ErrBadSignature: a fleet request whose signature, time, nonce or receiver is wrong.
	ErrBadSignature = errors.New("the fleet request's signature does not hold")
	// ErrNotPeer: an address a record names is not one of the fleet's.
	ErrNotPeer = errors.New("the address is not a replica of this fleet")
	// ErrMisdirected: a fleet request, signed with the fleet's secret, meant for another
	// replica: the one it names no longer lives at this address (a replica restarted there).
	ErrMisdirected = errors.New("the fleet request is meant for another replica")
)

// Config is a replica's place in the fleet.
type Config struct {
	// Instance names this replica (random per start when empty): 1 to 64 letters and digits.
	Instance string
	// Advertise is where the other replicas reach this one (http://ADDRESS:PORT).
	Advertise string
	// Secret is the fleet's shared secret (at least MinSecret bytes).
	Secret []byte
	// Peers are the address ranges the replicas are in; empty: Advertise's host alone.
	Peers []netip.Prefix
	// Store holds the registry (the store the replicas share).
	Store store.Store
	// Heartbeat is how often the replica's record is renewed (DefaultHeartbeat).
	Heartbeat time.Duration
	// Logger (slog.Default when nil).
	Logger *slog.Logger
	// Transport carries forwarded requests and probes (a fresh http.Transport when nil).
	Transport http.RoundTripper
}

// Replica is a replica's record in the registry.
type Replica struct {
	Instance string    `json:"instance"`
	Addr     string    `json:"addr"`
	Started  time.Time `json:"started"`
	Seen     time.Time `json:"seen"`
	Draining bool      `json:"draining,omitempty"`
	Version  string    `json:"version,omitempty"`
	PID      int       `json:"pid,omitempty"`
	Host     string    `json:"host,omitempty"`
}

// Fresh reports whether r renewed its record within three heartbeats of now.
func (r Replica) Fresh(now time.Time, heartbeat time.Duration) bool {
	return now.Sub(r.Seen) < 3*heartbeat
}

// Fleet is this replica's membership: its record, kept fresh until Close.
type Fleet struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	id     string // the fleet's name (ID)
	self   Replica

	mu       sync.Mutex
	draining bool
	nonces   map[string]time.Time // nonces of signed requests seen within MaxSkew
	closed   bool

	stop chan struct{}
	done chan struct{}
}

// ReadSecret reads a fleet secret from a file that group and others may not read.
func ReadSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the fleet secret: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading the fleet secret: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("the fleet secret file %s is readable by others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 4<<10))
	if err != nil {
		return nil, fmt.Errorf("reading the fleet secret: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinSecret {
		return nil, fmt.Errorf("the fleet secret in %s is %d bytes: it must be at least %d (openssl rand -hex 32)", path, len(b), MinSecret)
	}
	return b, nil
}

// NewInstance makes a random instance name.
func NewInstance() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Join registers this replica in the store and keeps its record fresh until Close.
func Join(ctx context.Context, cfg Config) (*Fleet, error) {
	if cfg.Instance == "" {
		cfg.Instance = NewInstance()
	}
	if !storekeys.ValidFleetName(cfg.Instance) {
		return nil, fmt.Errorf("fleet: instance %q: use 1 to 64 letters and digits", cfg.Instance)
	}
	if len(cfg.Secret) < MinSecret {
		return nil, fmt.Errorf("fleet: the secret must be at least %d bytes", MinSecret)
	}
	if cfg.Store == nil {
		return nil, errors.New("fleet: no store")
	}
	u, err := url.Parse(cfg.Advertise)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fleet: the advertised address %q is not http://ADDRESS:PORT", cfg.Advertise)
	}
	cfg.Advertise = u.Scheme + "://" + u.Host
	if len(cfg.Peers) == 0 {
		ip, err := hostIP(u.Host)
		if err != nil {
			return nil, fmt.Errorf("fleet: the advertised address %q: %w", cfg.Advertise, err)
		}
		cfg.Peers = []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Transport == nil {
		cfg.Transport = &http.Transport{
			Proxy:                 nil, // never through a proxy from the environment
			DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 0, // a tool call may run for minutes; the client's context bounds it
		}
	}
	if err := checkPeer(cfg.Peers, cfg.Advertise); err != nil {
		return nil, fmt.Errorf("fleet: serve.fleet.peers does not hold this replica's own address %s", cfg.Advertise)
	}
	id, err := ID(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now().UTC()
	f := &Fleet{cfg: cfg, log: cfg.Logger, id: id, client: &http.Client{Transport: cfg.Transport,
		// A forwarded request follows no redirect: a peer that answers one is answered as is.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		self:   Replica{Instance: cfg.Instance, Addr: cfg.Advertise, Started: now, PID: os.Getpid(), Host: host},
		nonces: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := f.publish(ctx); err != nil {
		return nil, err
	}
	go f.heartbeat() // owned by f: Close stops it
	return f, nil
}

// ID is the fleet's name (see ID): the sandboxes its replicas start carry it.
func (f *Fleet) ID() string { return f.id }

// Instance is this replica's name.
func (f *Fleet) Instance() string { return f.cfg.Instance }

// Advertise is this replica's advertised address.
func (f *Fleet) Advertise() string { return f.cfg.Advertise }

// Heartbeat is how often records are renewed.
func (f *Fleet) Heartbeat() time.Duration { return f.cfg.Heartbeat }

// SetDraining marks this replica as draining (it takes no new project) in its record.
func (f *Fleet) SetDraining(ctx context.Context) error {
	f.mu.Lock()
	f.draining = true
	f.mu.Unlock()
	return f.publish(ctx)
}

// Draining reports whether SetDraining was called.
func (f *Fleet) Draining() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining
}

// Close stops the heartbeat and removes this replica's record.
func (f *Fleet) Close(ctx context.Context) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	close(f.stop)
	<-f.done
	if err := f.cfg.Store.Delete(ctx, storekeys.FleetReplica(f.cfg.Instance)); err != nil {
		return fmt.Errorf("fleet: removing this replica's record: %w", err)
	}
	return nil
}

func (f *Fleet) heartbeat() {
	defer close(f.done)
	t := time.NewTicker(f.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Heartbeat)
			if err := f.publish(ctx); err != nil {
				f.log.Warn("fleet: renewing this replica's record", "err", err)
			}
			cancel()
		}
	}
}

func (f *Fleet) publish(ctx context.Context) error {
	f.mu.Lock()
	r := f.self
	r.Draining = f.draining
	f.mu.Unlock()
	r.Seen = time.Now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = f.cfg.Store.Put(ctx, storekeys.FleetReplica(r.Instance), bytes.NewReader(b),
		store.PutOptions{Size: int64(len(b)), ContentType: "application/json"})
	if err != nil {
		return fmt.Errorf("fleet: writing this replica's record: %w", err)
	}
	return nil
}

// Replicas lists the registry's records, stale ones included (see Replica.Fresh). A
// record that does not parse, or whose key and instance disagree, is left out.
func (f *Fleet) Replicas(ctx context.Context) ([]Replica, error) {
	return ListReplicas(ctx, f.cfg.Store)
}

// ListReplicas lists the replica records of the fleet sharing st.
func ListReplicas(ctx context.Context, st store.Store) ([]Replica, error) {
	objs, err := store.ListAll(ctx, st, storekeys.FleetReplicas)
	if err != nil {
		return nil, fmt.Errorf("fleet: listing the replicas: %w", err)
	}
	var out []Replica
	for _, o := range objs {
		inst := strings.TrimPrefix(o.Key, storekeys.FleetReplicas)
		if !storekeys.ValidFleetName(inst) {
			continue
		}
		var r Replica
		if err := ReadRecord(ctx, st, o.Key, maxRecord, &r); err != nil || r.Instance != inst {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Replica reads one replica's record; store.ErrNotFound when it has none.
func (f *Fleet) Replica(ctx context.Context, instance string) (Replica, error) {
	var r Replica
	if !storekeys.ValidFleetName(instance) {
		return r, fmt.Errorf("fleet: replica %q: %w", instance, store.ErrNotFound)
	}
	if err := ReadRecord(ctx, f.cfg.Store, storekeys.FleetReplica(instance), maxRecord, &r); err != nil {
		return r, err
	}
	if r.Instance != instance {
		return r, fmt.Errorf("fleet: the record of replica %s names %q", instance, r.Instance)
	}
	return r, nil
}

// ErrBadRecord: a record in the store is larger than its bound or not the JSON it should
// be (the store may hold anything).
var ErrBadRecord = errors.New("not a record this fleet wrote")

// ReadRecord decodes the JSON record at key into v, reading at most limit bytes of it: a
// larger one, or one that is not JSON, is ErrBadRecord; store.ErrNotFound when there is
// none; the store's error when it could not be read.
func ReadRecord(ctx context.Context, st store.Store, key string, limit int, v any) error {
	rc, _, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return err
	}
	if len(b) > limit {
		return fmt.Errorf("%w: the record %s is larger than %d bytes", ErrBadRecord, key, limit)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: the record %s: %w", ErrBadRecord, key, err)
	}
	return nil
}

// hostIP is the address of a host:port whose host is an IP literal.
func hostIP(hostport string) (netip.Addr, error) {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		h = hostport
	}
	ip, err := netip.ParseAddr(strings.Trim(h, "[]"))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("its host must be an IP address (the other replicas dial it as such)")
	}
	return ip.Unmap(), nil
}

// checkPeer reports whether addr (a URL) lies in the fleet's peer ranges.
func checkPeer(peers []netip.Prefix, addr string) error {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return fmt.Errorf("%w: %q is not http://ADDRESS:PORT", ErrNotPeer, addr)
	}
	ip, err := hostIP(u.Host)
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrNotPeer, addr, err)
	}
	for _, p := range peers {
		if p.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is outside serve.fleet.peers", ErrNotPeer, addr)
}

// mac is the HMAC-SHA256 of the fields, each length-prefixed so no two lists sign alike.
func (f *Fleet) mac(fields ...string) []byte {
	m := hmac.New(sha256.New, f.cfg.Secret)
	for _, s := range fields {
		m.Write([]byte(strconv.Itoa(len(s))))
		m.Write([]byte{':'})
		m.Write([]byte(s))
	}
	return m.Sum(nil)
}

// signed are the request headers a signature covers besides the fleet's own.
var signed = []string{"Toolhost-Project", "Mcp-Session-Id", "Mcp-Protocol-Version", "Content-Type", "Accept", "Last-Event-Id"}

func (f *Fleet) requestMAC(r *http.Request, bodyDigest string) []byte {
	fields := []string{"toolhost-fleet-request-v1", r.Method, r.URL.RequestURI(),
		r.Header.Get(HeaderFrom), r.Header.Get(HeaderTo), r.Header.Get(HeaderPrincipal),
		r.Header.Get(HeaderTime), r.Header.Get(HeaderNonce), bodyDigest}
	for _, h := range signed {
		fields = append(fields, strings.Join(r.Header.Values(h), "\x00"))
	}
	return f.mac(fields...)
}

// Sign makes r a fleet request from this replica to the replica named to, acting for
// principal (a token's name; "" without tokens), over body (r's body, already read).
// It drops r's Authorization: a client's credential never leaves the replica it reached.
func (f *Fleet) Sign(r *http.Request, to, principal string, body []byte) {
	r.Header.Del("Authorization")
	for _, h := range []string{HeaderFrom, HeaderTo, HeaderPrincipal, HeaderTime, HeaderNonce, HeaderSignature} {
		r.Header.Del(h)
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	r.Header.Set(HeaderFrom, f.cfg.Instance)
	r.Header.Set(HeaderTo, to)
	if principal != "" {
		r.Header.Set(HeaderPrincipal, principal)
	}
	r.Header.Set(HeaderTime, strconv.FormatInt(time.Now().Unix(), 10))
	r.Header.Set(HeaderNonce, hex.EncodeToString(nonce))
	d := sha256.Sum256(body)
	r.Header.Set(HeaderSignature, hex.EncodeToString(f.requestMAC(r, hex.EncodeToString(d[:]))))
}

// Signed reports whether r claims to be a fleet request (Verify decides if it is).
func Signed(r *http.Request) bool { return r.Header.Get(HeaderSignature) != "" }

// Verify checks a fleet request's signature over body (r's body, already read) and
// answers the principal it acts for and the replica that sent it. ErrUnsigned when it
// carries no signature; ErrBadSignature, saying why, when it does not hold.
func (f *Fleet) Verify(r *http.Request, body []byte) (principal, from string, err error) {
	sig := r.Header.Get(HeaderSignature)
	if sig == "" {
		return "", "", ErrUnsigned
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return "", "", fmt.Errorf("%w: not hex", ErrBadSignature)
	}
	d := sha256.Sum256(body)
	if !hmac.Equal(got, f.requestMAC(r, hex.EncodeToString(d[:]))) {
		return "", "", fmt.Errorf("%w: made with another secret, or the request was changed", ErrBadSignature)
	}
	if to := r.Header.Get(HeaderTo); to != f.cfg.Instance {
		return "", "", fmt.Errorf("%w %q, not this one (%s)", ErrMisdirected, to, f.cfg.Instance)
	}
	sec, err := strconv.ParseInt(r.Header.Get(HeaderTime), 10, 64)
	now := time.Now()
	if err != nil {
		return "", "", fmt.Errorf("%w: no time", ErrBadSignature)
	}
	if t := time.Unix(sec, 0); t.Before(now.Add(-MaxSkew)) || t.After(now.Add(MaxSkew)) {
		return "", "", fmt.Errorf("%w: its time %s is more than %s from this replica's", ErrBadSignature, t.UTC().Format(time.RFC3339), MaxSkew)
	}
	nonce := r.Header.Get(HeaderNonce)
	if len(nonce) != 32 {
		return "", "", fmt.Errorf("%w: no nonce", ErrBadSignature)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, t := range f.nonces {
		if now.Sub(t) > 2*MaxSkew {
			delete(f.nonces, n)
		}
	}
	if _, seen := f.nonces[nonce]; seen {
		return "", "", fmt.Errorf("%w: a replay (its nonce was seen)", ErrBadSignature)
	}
	f.nonces[nonce] = now
	return r.Header.Get(HeaderPrincipal), r.Header.Get(HeaderFrom), nil
}

// healthAnswer is what the health endpoint answers.
type healthAnswer struct {
	Instance string `json:"instance"`
	Draining bool   `json:"draining,omitempty"`
	Proof    string `json:"proof"`
}

// HealthHandler answers GET HealthPath?nonce=N with this replica's instance and an HMAC
// of the nonce: proof that it is this fleet's replica of that name.
func (f *Fleet) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nonce := r.URL.Query().Get("nonce")
		if len(nonce) < 16 || len(nonce) > 128 {
			http.Error(w, "nonce: 16 to 128 characters", http.StatusBadRequest)
			return
		}
		a := healthAnswer{Instance: f.cfg.Instance, Draining: f.Draining(),
			Proof: hex.EncodeToString(f.mac("toolhost-fleet-health-v1", f.cfg.Instance, nonce))}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(a)
	})
}

// Probe asks the address addr whether the replica named instance lives there, within
// timeout (lease.Config.Probe's answer). Only proof counts: a refused connection, or a fleet replica of another name
// answering, is Dead; the named replica proving itself is Alive; anything else (a
// timeout, an answer without proof, an address outside the peer ranges) is Unknown.
func (f *Fleet) Probe(ctx context.Context, addr, instance string, timeout time.Duration) lease.Liveness {
	if checkPeer(f.cfg.Peers, addr) != nil || !storekeys.ValidFleetName(instance) {
		return lease.Unknown
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nb := make([]byte, 16)
	rand.Read(nb)
	nonce := hex.EncodeToString(nb)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(addr, "/")+HealthPath+"?nonce="+nonce, nil)
	if err != nil {
		return lease.Unknown
	}
	resp, err := f.client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return lease.Dead
		}
		return lease.Unknown
	}
	defer resp.Body.Close()
	var a healthAnswer
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&a) != nil {
		return lease.Unknown
	}
	proof, err := hex.DecodeString(a.Proof)
	if err != nil || !hmac.Equal(proof, f.mac("toolhost-fleet-health-v1", a.Instance, nonce)) {
		return lease.Unknown // not a replica of this fleet: proves nothing about the one named
	}
	if a.Instance != instance {
		return lease.Dead // a replica of the fleet, another one: the named one is gone
	}
	return lease.Alive
}

// CheckTarget decides whether a request may be forwarded to the replica a lease record
// names (instance at addr): addr must lie in the peer ranges and be the address the
// registry has for that instance, whose record must be fresh. It never trusts the lease
// record alone.
func (f *Fleet) CheckTarget(ctx context.Context, instance, addr string) error {
	if instance == f.cfg.Instance {
		return fmt.Errorf("%w: it names this replica", ErrNotPeer)
	}
	if err := checkPeer(f.cfg.Peers, addr); err != nil {
		return err
	}
	r, err := f.Replica(ctx, instance)
	if err != nil {
		return fmt.Errorf("%w: replica %s has no record in the registry (%v)", ErrNotPeer, instance, err)
	}
	if r.Addr != addr {
		return fmt.Errorf("%w: the registry has replica %s at %s, the lease names %s", ErrNotPeer, instance, r.Addr, addr)
	}
	if !r.Fresh(time.Now(), f.cfg.Heartbeat) {
		return fmt.Errorf("%w: replica %s last renewed its record at %s", ErrNotPeer, instance, r.Seen.Format(time.RFC3339))
	}
	return nil
}

// Client is the HTTP client forwarded requests go through.
func (f *Fleet) Client() *http.Client { return f.client }
