//go:build k8s

package kubernetes

import (
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/toolhost/toolhost/internal/testenv"
)

// TestAgentImageKeepsItsDigestInARegistry: the agent image scripts/k8s/image.sh builds,
// copied into an OCI registry as it is (go-containerregistry's remote.Write, what crane
// push does), is served there under the digest the archive names, so a pod that names the
// image by that digest (kubernetes.image's pinned default) pulls the same bytes from any
// registry the operator copies it to. The registry is go-containerregistry's own, on
// loopback.
func TestAgentImageKeepsItsDigestInARegistry(t *testing.T) {
	dir := os.Getenv("TOOLHOST_TEST_K8S_DIR")
	if dir == "" {
		testenv.Skipf(t, "no agent image: TOOLHOST_TEST_K8S_DIR is not set (make test-k8s builds the image and sets it)")
	}
	want, err := os.ReadFile(filepath.Join(dir, "images", "agent.digest"))
	if err != nil {
		t.Fatalf("the agent image's digest (scripts/k8s/image.sh writes it): %v", err)
	}
	lay := t.TempDir()
	if out, err := exec.Command("tar", "-xf", filepath.Join(dir, "images", "agent.tar"), "-C", lay).CombinedOutput(); err != nil {
		t.Fatalf("unpack the image archive: %v\n%s", err, out)
	}
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("the archive's index names %d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0].Digest
	if d.String() != strings.TrimSpace(string(want)) {
		t.Fatalf("the archive's manifest is %s, agent.digest says %s", d, want)
	}
	img, err := p.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host+"/toolhost/toolhost-agent:copy", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push to the registry: %v", err)
	}
	got, err := remote.Head(ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != d {
		t.Errorf("the registry serves the image as %s, the archive names %s: a pin by digest would not pull it", got.Digest, d)
	}
	// And pulled back by that digest, its layers are the archive's.
	byDigest, err := name.ParseReference(host+"/toolhost/toolhost-agent@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(byDigest)
	if err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
	layers := func(i v1.Image) []v1.Hash {
		ls, err := i.Layers()
		if err != nil {
			t.Fatal(err)
		}
		var out []v1.Hash
		for _, l := range ls {
			h, err := l.Digest()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, h)
		}
		return out
	}
	if a, b := layers(img), layers(pulled); len(a) != len(b) || len(a) != 1 || a[0] != b[0] {
		t.Errorf("layers: archive %v, pulled %v", a, b)
	}
}
