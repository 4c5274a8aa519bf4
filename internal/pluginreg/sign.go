package pluginreg

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The signature of a plugin is a Sigstore bundle (v0.3, a message signature over the
// plugin's manifest: its digest is the manifest's digest), attached to the plugin through
// the OCI referrers API as an artifact of type BundleMediaType whose subject is the
// plugin's manifest. Keys are ECDSA P-256 (cosign's default), PEM: the private key
// PKCS #8, the public key PKIX. docs/PLUGINS.md says why the bundle is made and checked
// here rather than through sigstore-go.
const (
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	emptyMediaType  = "application/vnd.oci.empty.v1+json"
)

// Bundle is the part of a Sigstore bundle (v0.3) a keyed message signature uses.
type Bundle struct {
	MediaType            string `json:"mediaType"`
	VerificationMaterial struct {
		PublicKey struct {
			Hint string `json:"hint"`
		} `json:"publicKey"`
		TlogEntries []json.RawMessage `json:"tlogEntries"`
	} `json:"verificationMaterial"`
	MessageSignature struct {
		MessageDigest struct {
			Algorithm string `json:"algorithm"`
			Digest    []byte `json:"digest"`
		} `json:"messageDigest"`
		Signature []byte `json:"signature"`
	} `json:"messageSignature"`
}

// GenerateKey makes a key pair: the private key's PEM (PKCS #8) and the public key's
// (PKIX).
func GenerateKey() (priv, pub []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	pder, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}), nil
}

// ParsePrivateKey reads a PEM private key (PKCS #8 or SEC 1 EC), ECDSA P-256.
func ParsePrivateKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("not a PEM private key")
	}
	if blk.Type == "ENCRYPTED PRIVATE KEY" || blk.Type == "ENCRYPTED SIGSTORE PRIVATE KEY" {
		return nil, fmt.Errorf("the key is encrypted: give an unencrypted PKCS #8 key (toolhost plugin sign --generate-key makes one)")
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return p256(k)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key: want ECDSA P-256, got %T", k)
	}
	return p256(ek)
}

func p256(k *ecdsa.PrivateKey) (*ecdsa.PrivateKey, error) {
	if k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("private key: want ECDSA P-256, got %s", k.Curve.Params().Name)
	}
	return k, nil
}

// ParsePublicKey reads a PEM public key (PKIX), ECDSA P-256.
func ParsePublicKey(b []byte) (*ecdsa.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("not a PEM public key")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("public key: want ECDSA P-256, got %T", k)
	}
	return ek, nil
}

// ReadPublicKeys reads the PEM public keys of the files.
func ReadPublicKeys(files []string) ([]*ecdsa.PublicKey, error) {
	var out []*ecdsa.PublicKey
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		k, err := ParsePublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// KeyID names a public key: "sha256:" and the hex of the digest of its PKIX DER.
func KeyID(k *ecdsa.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return "?"
	}
	s := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(s[:])
}

// SignDigest makes the bundle of a signature of the manifest whose digest is digest.
func SignDigest(k *ecdsa.PrivateKey, digest string) ([]byte, error) {
	h, err := v1.NewHash(digest)
	if err != nil || h.Algorithm != "sha256" {
		return nil, fmt.Errorf("%q is not a sha256 digest", digest)
	}
	sum, err := hex.DecodeString(h.Hex)
	if err != nil {
		return nil, err
	}
	sig, err := k.Sign(rand.Reader, sum, crypto.SHA256)
	if err != nil {
		return nil, err
	}
	var b Bundle
	b.MediaType = BundleMediaType
	b.VerificationMaterial.PublicKey.Hint = KeyID(&k.PublicKey)
	b.VerificationMaterial.TlogEntries = []json.RawMessage{}
	b.MessageSignature.MessageDigest.Algorithm = "SHA2_256"
	b.MessageSignature.MessageDigest.Digest = sum
	b.MessageSignature.Signature = sig
	return json.Marshal(b)
}

// VerifyBundle checks that the bundle signs the manifest of digest with one of keys and
// returns that key's ID.
func VerifyBundle(bundle []byte, digest string, keys []*ecdsa.PublicKey) (string, error) {
	var b Bundle
	if err := json.Unmarshal(bundle, &b); err != nil {
		return "", fmt.Errorf("%v: %w", err, ErrBadBundle)
	}
	if b.MediaType != BundleMediaType || b.MessageSignature.MessageDigest.Algorithm != "SHA2_256" {
		return "", fmt.Errorf("want a %s message signature over SHA2_256, got %q: %w", BundleMediaType, b.MediaType, ErrBadBundle)
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return "", err
	}
	if base64.StdEncoding.EncodeToString(b.MessageSignature.MessageDigest.Digest) != hexToB64(h.Hex) {
		return "", fmt.Errorf("the bundle signs another manifest than %s: %w", digest, ErrBadBundle)
	}
	for _, k := range keys {
		if ecdsa.VerifyASN1(k, b.MessageSignature.MessageDigest.Digest, b.MessageSignature.Signature) {
			return KeyID(k), nil
		}
	}
	return "", fmt.Errorf("signed by key %s, which is not among the %d trusted (registry.keys): %w", b.VerificationMaterial.PublicKey.Hint, len(keys), ErrUntrusted)
}

func hexToB64(h string) string {
	b, err := hex.DecodeString(h)
	if err != nil {
		return ""
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Sign signs the plugin at ref with k and attaches the bundle to it (referrers API, or
// its tag fallback). It returns the manifest digest signed.
func Sign(ctx context.Context, ref string, k *ecdsa.PrivateKey, o Options) (string, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return "", err
	}
	ctx, cancel := o.context(ctx)
	defer cancel()
	ro := o.remote(ctx)
	d, err := remote.Head(r, ro...)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ref, deadline(ctx, err))
	}
	digest := d.Digest.String()
	bundle, err := SignDigest(k, digest)
	if err != nil {
		return "", err
	}
	if err := remote.WriteLayer(r.Context(), static.NewLayer(bundle, BundleMediaType), ro...); err != nil {
		return "", fmt.Errorf("%s: %w", ref, err)
	}
	if err := remote.WriteLayer(r.Context(), static.NewLayer([]byte("{}"), emptyMediaType), ro...); err != nil {
		return "", fmt.Errorf("%s: %w", ref, err)
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: ManifestMediaType, ArtifactType: BundleMediaType,
		Config:  v1.Descriptor{MediaType: emptyMediaType, Size: 2, Digest: mustHash(Digest([]byte("{}")))},
		Layers:  []v1.Descriptor{{MediaType: BundleMediaType, Size: int64(len(bundle)), Digest: mustHash(Digest(bundle))}},
		Subject: &v1.Descriptor{MediaType: d.MediaType, Size: d.Size, Digest: d.Digest},
		Annotations: map[string]string{"dev.sigstore.bundle.content": "message-signature",
			"dev.sigstore.bundle.predicateType": "", "dev.toolhost.signer": KeyID(&k.PublicKey)},
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	if err := remote.Put(r.Context().Digest(Digest(mb)), rawManifest{mb, ManifestMediaType}, ro...); err != nil {
		return "", fmt.Errorf("%s: attaching the signature: %w", ref, err)
	}
	return digest, nil
}

// Bundles fetches the signature bundles attached to the manifest digest of repo (at most
// maxBundles of them).
func Bundles(ctx context.Context, repo, digest string, o Options) ([][]byte, error) {
	r, err := name.NewRepository(repo, name.StrictValidation)
	if err != nil {
		return nil, fmt.Errorf("%q: %v: %w", repo, err, ErrRef)
	}
	ctx, cancel := o.context(ctx)
	defer cancel()
	// Not filtered by artifactType: registries that predate it report the config's media
	// type instead (the empty one, for a bundle). Each referrer's manifest says.
	ro := o.remote(ctx)
	idx, err := remote.Referrers(r.Digest(digest), ro...)
	if err != nil {
		return nil, fmt.Errorf("%s@%s: its signatures: %w", repo, digest, deadline(ctx, err))
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for i, desc := range im.Manifests {
		if i == maxReferrers {
			break
		}
		if desc.ArtifactType != BundleMediaType && desc.ArtifactType != emptyMediaType {
			continue
		}
		if len(out) == maxBundles {
			break
		}
		if desc.Size > maxManifestBytes {
			continue
		}
		md, err := remote.Get(r.Digest(desc.Digest.String()), ro...)
		if err != nil {
			return nil, fmt.Errorf("%s: a signature: %w", repo, deadline(ctx, err))
		}
		if Digest(md.Manifest) != desc.Digest.String() {
			continue
		}
		var m v1.Manifest
		if err := json.Unmarshal(md.Manifest, &m); err != nil || m.ArtifactType != BundleMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != types.MediaType(BundleMediaType) ||
			m.Layers[0].Size > maxManifestBytes || m.Subject == nil || m.Subject.Digest.String() != digest {
			continue
		}
		b, err := fetchBlob(r, m.Layers[0], ro)
		if err != nil {
			return nil, fmt.Errorf("%s: a signature: %w", repo, deadline(ctx, err))
		}
		out = append(out, b)
	}
	return out, nil
}

// maxBundles bounds the signatures kept for one plugin; maxReferrers the artifacts
// looked at to find them.
const (
	maxBundles   = 16
	maxReferrers = 64
)

// VerifyArtifact checks the signatures of a: one of them by one of keys. It returns the
// signer's key ID, or ErrUnsigned, or ErrUntrusted.
func VerifyArtifact(ctx context.Context, a *Artifact, keys []*ecdsa.PublicKey, o Options) (string, error) {
	bundles, err := Bundles(ctx, a.Repo, a.Digest, o)
	if err != nil {
		return "", err
	}
	if len(bundles) == 0 {
		return "", fmt.Errorf("%s (%s) has no signature: %w", a.Ref, a.Digest, ErrUnsigned)
	}
	var last error
	for _, b := range bundles {
		signer, err := VerifyBundle(b, a.Digest, keys)
		if err == nil {
			return signer, nil
		}
		last = err
	}
	return "", fmt.Errorf("%s (%s): %w", a.Ref, a.Digest, last)
}
