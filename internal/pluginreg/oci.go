// Package pluginreg publishes plugins to OCI registries and installs them from there,
// verified: the artifact layout, signatures (Sigstore bundles, keyed), the lock file
// beside the configuration (toolhost.lock), the capability diff of an upgrade, and the
// edit of the configuration that adds or upgrades a plugin. The CLI's `toolhost plugin
// push|add|sign|verify|upgrade` are thin glue over it.
//
// A plugin is an OCI image manifest in the CNCF TAG Runtime's Wasm artifact layout (what
// wkg, Spin and wasmCloud read): a config of media type application/vnd.wasm.config.v0+json
// and the module as its one layer, application/wasm. toolhost's own description of the
// plugin (its manifest, the grants it needs, its host imports) rides in the annotation
// AnnotationMeta, so other Wasm tools pull the module unchanged. The annotation is a claim:
// an installer inspects the module itself and refuses a plugin whose claim differs.
//
// Everything a registry sends is hostile input: sizes are bounded before and while
// reading, every blob's digest is checked, and every operation runs under a deadline.
package pluginreg

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/toolhost/toolhost/abi"
	"github.com/toolhost/toolhost/internal/host"
)

// Media types and annotations of the artifact.
const (
	ConfigMediaType = "application/vnd.wasm.config.v0+json"
	WasmMediaType   = "application/wasm"
	// AnnotationMeta holds toolhost's description of the plugin (Meta, as JSON).
	AnnotationMeta = "dev.toolhost.plugin.v1+json"
	// ManifestMediaType is the OCI image manifest's.
	ManifestMediaType = "application/vnd.oci.image.manifest.v1+json"
)

// Bounds of a pull, unless Options say otherwise.
const (
	DefaultMaxBytes = 64 << 20
	DefaultTimeout  = 2 * time.Minute
	// maxManifestBytes bounds a manifest, a referrers index and a signature bundle.
	maxManifestBytes = 4 << 20
)

// Errors a caller tells apart with errors.Is.
var (
	ErrRef         = errors.New("bad plugin reference")
	ErrNotPlugin   = errors.New("not a toolhost plugin artifact")
	ErrTooLarge    = errors.New("over the size bound")
	ErrDigest      = errors.New("bytes differ from their digest")
	ErrMetaLies    = errors.New("the artifact's description differs from the module")
	ErrUnsigned    = errors.New("unsigned")
	ErrUntrusted   = errors.New("signed by no trusted key")
	ErrBadBundle   = errors.New("bad signature bundle")
	ErrLockDiffers = errors.New("plugin differs from the lock")
)

// Meta is toolhost's description of a plugin, in the annotation AnnotationMeta: what
// `toolhost plugin inspect` says of the module.
type Meta struct {
	Manifest abi.Manifest     `json:"manifest"`
	Needs    []abi.Capability `json:"needs"`
	Imports  []string         `json:"imports"`
}

// Describe inspects the module (granting it nothing) and returns its Meta.
func Describe(ctx context.Context, wasm []byte) (Meta, error) {
	in, err := host.Inspect(ctx, wasm)
	if err != nil {
		return Meta{}, err
	}
	m := Meta{Manifest: in.Manifest, Needs: slices.Clone(in.Needs), Imports: []string{}}
	if m.Needs == nil {
		m.Needs = []abi.Capability{}
	}
	for _, im := range in.Imports {
		if _, ok := abi.CapabilityOfModule(im.Module); ok || strings.HasPrefix(im.Module, "toolhost") {
			m.Imports = append(m.Imports, im.Module+"."+im.Name)
		}
	}
	slices.Sort(m.Imports)
	return m, nil
}

// Options are what a push or a pull runs with.
type Options struct {
	// Keychain finds credentials; nil: ~/.docker/config.json and its credential helpers
	// (authn.DefaultKeychain).
	Keychain authn.Keychain
	// MaxBytes bounds the module; 0: DefaultMaxBytes.
	MaxBytes int64
	// Timeout bounds the whole operation; 0: DefaultTimeout.
	Timeout time.Duration
	// Transport, for tests; nil: http.DefaultTransport.
	Transport http.RoundTripper
}

func (o Options) maxBytes() int64 { return cmpOr(o.MaxBytes, DefaultMaxBytes) }

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func (o Options) remote(ctx context.Context) []remote.Option {
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	t := o.Transport
	if t == nil {
		t = http.DefaultTransport
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc),
		remote.WithTransport(bodyLimit{t, o.maxBytes() + maxManifestBytes}),
		remote.WithUserAgent("toolhost"), remote.WithReferrersTagFallback(true)}
}

func (o Options) context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, cmpOr(o.Timeout, DefaultTimeout))
}

// bodyLimit fails any response body that runs past n bytes.
type bodyLimit struct {
	rt http.RoundTripper
	n  int64
}

func (b bodyLimit) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > b.n {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: the registry answered with %d bytes, more than the %d allowed: %w", r.URL.Path, resp.ContentLength, b.n, ErrTooLarge)
	}
	resp.Body = &limitedBody{rc: resp.Body, left: b.n}
	return resp, nil
}

type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, fmt.Errorf("the registry sent more bytes than allowed: %w", ErrTooLarge)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.rc.Close() }

// ParseRef parses a plugin reference, registry/repository[:tag][@digest], strictly: no
// default registry, no path traversal, no scheme.
func ParseRef(ref string) (name.Reference, error) {
	if strings.Contains(ref, "://") || strings.ContainsAny(ref, " \\\x00") {
		return nil, fmt.Errorf("%q: a reference is registry/repository:tag or @sha256:digest, without a scheme: %w", ref, ErrRef)
	}
	repo, _, _ := strings.Cut(ref, "@")
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	first, rest, ok := strings.Cut(repo, "/")
	if !ok || rest == "" || !(strings.ContainsAny(first, ".:") || first == "localhost") {
		return nil, fmt.Errorf("%q: name the registry (registry.example/team/plugin:1.0): %w", ref, ErrRef)
	}
	if !registryRE.MatchString(first) {
		return nil, fmt.Errorf("%q: %q is not a registry host[:port]: %w", ref, first, ErrRef)
	}
	for _, part := range strings.Split(rest, "/") {
		if part == "" || part == "." || part == ".." {
			return nil, fmt.Errorf("%q: %q is not a repository path component: %w", ref, part, ErrRef)
		}
	}
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("%q: %v: %w", ref, err, ErrRef)
	}
	return r, nil
}

// registryRE is a registry's host (a DNS name of labels, or an IPv4 or bracketed IPv6
// address) and optional port.
var registryRE = regexp.MustCompile(`^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$`)

// Digest is the sha256 digest of b, "sha256:hex".
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// wasmConfig is the Wasm OCI artifact's config.
type wasmConfig struct {
	Created      string   `json:"created,omitempty"`
	Architecture string   `json:"architecture"`
	OS           string   `json:"os"`
	LayerDigests []string `json:"layerDigests"`
}

type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// Push publishes the module wasm, described by meta, at ref and returns the manifest's
// digest.
func Push(ctx context.Context, ref string, wasm []byte, meta Meta, o Options) (string, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	if int64(len(wasm)) > o.maxBytes() {
		return "", fmt.Errorf("the module is %d bytes, more than the %d allowed: %w", len(wasm), o.maxBytes(), ErrTooLarge)
	}
	ctx, cancel := o.context(ctx)
	defer cancel()
	ro := o.remote(ctx)
	wasmDigest := Digest(wasm)
	cfg, err := json.Marshal(wasmConfig{Architecture: "wasm", OS: "wasip1", LayerDigests: []string{wasmDigest}})
	if err != nil {
		return "", err
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return "", err
	}
	for _, blob := range []struct {
		b  []byte
		mt types.MediaType
	}{{cfg, ConfigMediaType}, {wasm, WasmMediaType}} {
		if err := remote.WriteLayer(r.Context(), static.NewLayer(blob.b, blob.mt), ro...); err != nil {
			return "", fmt.Errorf("pushing %s: %w", ref, err)
		}
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     ManifestMediaType,
		Config:        v1.Descriptor{MediaType: ConfigMediaType, Size: int64(len(cfg)), Digest: mustHash(Digest(cfg))},
		Layers: []v1.Descriptor{{MediaType: WasmMediaType, Size: int64(len(wasm)), Digest: mustHash(wasmDigest),
			Annotations: map[string]string{"org.opencontainers.image.title": meta.Manifest.Name + ".wasm"}}},
		Annotations: map[string]string{AnnotationMeta: string(metaJSON),
			"org.opencontainers.image.title":   meta.Manifest.Name,
			"org.opencontainers.image.version": meta.Manifest.Version},
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	if err := remote.Put(r, rawManifest{mb, ManifestMediaType}, ro...); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	return Digest(mb), nil
}

func mustHash(d string) v1.Hash {
	h, err := v1.NewHash(d)
	if err != nil {
		panic(err)
	}
	return h
}

// Artifact is a pulled plugin.
type Artifact struct {
	// Ref is the reference pulled; Repo its repository (registry/repository); Registry its
	// registry's host.
	Ref, Repo, Registry string
	// Digest is the manifest's digest: what a signature signs and the lock pins.
	Digest string
	// Manifest is the manifest's bytes.
	Manifest []byte
	// Wasm is the module; WasmDigest its digest.
	Wasm       []byte
	WasmDigest string
	// Meta is what the artifact says of the module (its annotation).
	Meta Meta
}

// Pull fetches the plugin at ref: its manifest, checked to be a Wasm artifact with one
// module layer within the size bound, and the module, checked against its digest.
// ctx and o.Timeout bound it.
func Pull(ctx context.Context, ref string, o Options) (*Artifact, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	ctx, cancel := o.context(ctx)
	defer cancel()
	ro := o.remote(ctx)
	d, err := remote.Get(r, ro...)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, deadline(ctx, err))
	}
	a := &Artifact{Ref: ref, Repo: r.Context().Name(), Registry: r.Context().RegistryStr(), Manifest: d.Manifest, Digest: Digest(d.Manifest)}
	if len(d.Manifest) > maxManifestBytes {
		return nil, fmt.Errorf("%s: its manifest is %d bytes: %w", ref, len(d.Manifest), ErrTooLarge)
	}
	if dg, ok := r.(name.Digest); ok && dg.DigestStr() != a.Digest {
		return nil, fmt.Errorf("%s: the registry sent a manifest of digest %s: %w", ref, a.Digest, ErrDigest)
	}
	var m v1.Manifest
	if err := json.Unmarshal(d.Manifest, &m); err != nil {
		return nil, fmt.Errorf("%s: its manifest: %v: %w", ref, err, ErrNotPlugin)
	}
	if m.Config.MediaType != ConfigMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != WasmMediaType {
		return nil, fmt.Errorf("%s: want a config of type %s and one %s layer, got config %q and %d layers: %w",
			ref, ConfigMediaType, WasmMediaType, m.Config.MediaType, len(m.Layers), ErrNotPlugin)
	}
	metaJSON, ok := m.Annotations[AnnotationMeta]
	if !ok {
		return nil, fmt.Errorf("%s: no %s annotation (push it with toolhost plugin push): %w", ref, AnnotationMeta, ErrNotPlugin)
	}
	if err := json.Unmarshal([]byte(metaJSON), &a.Meta); err != nil {
		return nil, fmt.Errorf("%s: its %s annotation: %v: %w", ref, AnnotationMeta, err, ErrNotPlugin)
	}
	layer := m.Layers[0]
	if layer.Size > o.maxBytes() || layer.Size < 0 {
		return nil, fmt.Errorf("%s: its module is %d bytes, more than the %d allowed: %w", ref, layer.Size, o.maxBytes(), ErrTooLarge)
	}
	a.Wasm, err = fetchBlob(r.Context(), layer, ro)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, deadline(ctx, err))
	}
	a.WasmDigest = layer.Digest.String()
	return a, nil
}

// fetchBlob reads the blob of desc, at most desc.Size bytes, and checks its digest.
func fetchBlob(repo name.Repository, desc v1.Descriptor, ro []remote.Option) ([]byte, error) {
	if desc.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("layer digest %s: only sha256 is accepted: %w", desc.Digest, ErrNotPlugin)
	}
	l, err := remote.Layer(repo.Digest(desc.Digest.String()), ro...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	h := sha256.New()
	var buf bytes.Buffer
	_, err = io.Copy(io.MultiWriter(&buf, h), io.LimitReader(rc, desc.Size+1))
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	switch {
	case int64(buf.Len()) > desc.Size:
		return nil, fmt.Errorf("layer %s: the registry sent more than its %d bytes: %w", desc.Digest, desc.Size, ErrTooLarge)
	case got != desc.Digest.String():
		return nil, fmt.Errorf("layer %s: the registry sent bytes of digest %s: %w", desc.Digest, got, ErrDigest)
	case err != nil:
		return nil, err
	}
	return buf.Bytes(), nil
}

// deadline names a deadline that ended an operation.
func deadline(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (%w: the registry did not answer in time)", err, context.DeadlineExceeded)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: the registry did not answer in time", err)
	}
	return err
}

// CheckMeta compares what an artifact says of its module with what the module is.
func CheckMeta(claimed, actual Meta) error {
	var diffs []string
	if claimed.Manifest.Name != actual.Manifest.Name || claimed.Manifest.Version != actual.Manifest.Version {
		diffs = append(diffs, fmt.Sprintf("says %s %s, is %s %s", claimed.Manifest.Name, claimed.Manifest.Version, actual.Manifest.Name, actual.Manifest.Version))
	}
	if !slices.Equal(sortedCaps(claimed.Needs), sortedCaps(actual.Needs)) {
		diffs = append(diffs, fmt.Sprintf("says it needs [%s], needs [%s]", capList(claimed.Needs), capList(actual.Needs)))
	}
	if !slices.Equal(claimed.Imports, actual.Imports) {
		diffs = append(diffs, "lists other host imports than it has")
	}
	ct, at := toolNames(claimed.Manifest.Tools), toolNames(actual.Manifest.Tools)
	if !slices.Equal(ct, at) {
		diffs = append(diffs, fmt.Sprintf("says tools [%s], has [%s]", strings.Join(ct, ", "), strings.Join(at, ", ")))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(diffs, "; "), ErrMetaLies)
	}
	return nil
}

func sortedCaps(c []abi.Capability) []abi.Capability {
	c = slices.Clone(c)
	slices.Sort(c)
	return c
}

func capList(c []abi.Capability) string {
	var s []string
	for _, x := range sortedCaps(c) {
		s = append(s, string(x))
	}
	return strings.Join(s, ", ")
}

func toolNames(tools []abi.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	slices.Sort(out)
	return out
}
