package kubernetes

import (
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/toolhost/toolhost/core/sandbox"
)

// TestTemplateFor: a warm pool's template carries the pool's token and the pod's name for
// its agent, and no sandbox's token; its name is the same whatever the token (replicas
// share it) and differs by network mode and by configuration.
func TestTemplateFor(t *testing.T) {
	p, err := New(Config{Kubeconfig: deadKubeconfig(t), Image: "registry.example/agent@sha256:0", Pool: 2})
	if err != nil {
		t.Fatal(err)
	}
	tok1, tok2 := randomHex(tokenBytes), randomHex(tokenBytes)
	a, err := p.templateFor(sandbox.NetworkNone, tok1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := p.templateFor(sandbox.NetworkNone, tok2)
	h, _ := p.templateFor(sandbox.NetworkHost, tok1)
	if a.GetName() != b.GetName() {
		t.Errorf("the template's name depends on the pool's token: %s, %s", a.GetName(), b.GetName())
	}
	if a.GetName() == h.GetName() {
		t.Errorf("one template for two network modes: %s", a.GetName())
	}
	q, _ := New(Config{Kubeconfig: deadKubeconfig(t), Image: "registry.example/agent@sha256:1", Pool: 2})
	if c, _ := q.templateFor(sandbox.NetworkNone, tok1); c.GetName() == a.GetName() {
		t.Errorf("one template name for two images: %s", c.GetName())
	}
	if got, err := poolTokenOf(a); err != nil || got != tok1 {
		t.Errorf("poolTokenOf: %q %v, want the pool's token", got, err)
	}
	path := []string{"spec", "podTemplate", "spec", "containers"}
	if containerEnv(a.Object, envToken, path...) != "" {
		t.Error("the template holds a sandbox token")
	}
	containers, _, _ := unstructured.NestedSlice(a.Object, path...)
	env := containers[0].(map[string]any)["env"].([]any)
	var pod bool
	for _, e := range env {
		em := e.(map[string]any)
		if em["name"] == envPod {
			ref, _, _ := unstructured.NestedString(em, "valueFrom", "fieldRef", "fieldPath")
			pod = ref == "metadata.name"
		}
	}
	if !pod {
		t.Errorf("the agent is not given its pod's name: %v", env)
	}
	if a.GetLabels()[LabelNetwork] != sandbox.NetworkNone || a.GetLabels()[LabelManagedBy] != managedBy {
		t.Errorf("template labels %v", a.GetLabels())
	}
	foreign := a.DeepCopy()
	foreign.SetLabels(nil)
	if _, err := poolTokenOf(foreign); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("a template not made by toolhost: %v, want ErrForeign", err)
	}
}

// TestReadClaim: a claim of the provider's gives its labels, token and end; one of
// someone else's is foreign; an expired or tokenless one cannot be reached again; and a
// Sandbox is the claim's only when the claim controls it.
func TestReadClaim(t *testing.T) {
	tok := randomHex(tokenBytes)
	end := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	claim := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{
				"name": "toolhost-abc", "uid": "u-1",
				"labels":      map[string]any{LabelManagedBy: managedBy},
				"annotations": map[string]any{annotationLabels: `{"project":"p1","epoch":"3"}`, annotationToken: tok},
			},
			"spec": map[string]any{"lifecycle": map[string]any{"shutdownTime": end.Format(time.RFC3339)}},
		}}
		return u
	}
	f, err := readClaim(claim())
	if err != nil || !f.claimed || f.token != tok || !f.endsAt.Equal(end) || f.labels["project"] != "p1" || f.gone != "" {
		t.Errorf("readClaim: %+v %v", f, err)
	}
	u := claim()
	u.SetLabels(map[string]string{LabelManagedBy: "someone"})
	if _, err := readClaim(u); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("someone else's claim: %v, want ErrForeign", err)
	}
	u = claim()
	u.SetAnnotations(map[string]string{annotationLabels: "{}", annotationToken: "short"})
	if f, _ := readClaim(u); f.gone == "" {
		t.Error("a claim with no usable token: reachable")
	}
	u = claim()
	_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{"type": "Ready", "reason": "ClaimExpired"}}, "status", "conditions")
	if f, _ := readClaim(u); f.gone != "expired" {
		t.Errorf("an expired claim: gone %q", f.gone)
	}

	yes := true
	sb := &unstructured.Unstructured{Object: map[string]any{}}
	sb.SetName("toolhost-abc")
	sb.SetOwnerReferences([]metav1.OwnerReference{{Kind: "SandboxClaim", Name: "toolhost-abc", UID: "u-1", Controller: &yes}})
	if pod, _, err := podOf(sb, "u-1"); err != nil || pod != "toolhost-abc" {
		t.Errorf("podOf a Sandbox of its own pod: %q %v", pod, err)
	}
	sb.SetAnnotations(map[string]string{annotationPodName: "toolhost-none-warm-x1"})
	if pod, _, err := podOf(sb, "u-1"); err != nil || pod != "toolhost-none-warm-x1" {
		t.Errorf("podOf a Sandbox that adopted a warm pod: %q %v", pod, err)
	}
	if _, _, err := podOf(sb, types.UID("u-2")); !errors.Is(err, sandbox.ErrForeign) {
		t.Errorf("podOf another claim's Sandbox: %v, want ErrForeign", err)
	}
	if _, err := read(sb); err == nil || !strings.Contains(err.Error(), "SandboxClaim") {
		t.Errorf("read of a claim's Sandbox: %v, want it sent to the claim", err)
	}
}

// TestRoleIsVerbs: deploy/kubernetes-sandboxes/role.yaml grants exactly what the provider
// asks for (Verbs and PoolVerbs, which doctor checks), nothing more.
func TestRoleIsVerbs(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/kubernetes-sandboxes/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.Role
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for _, r := range append(slices.Clone(Verbs), PoolVerbs...) {
		want[r.Group+"/"+r.Resource] = slices.Sorted(slices.Values(r.Verbs))
	}
	got := map[string][]string{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = append(got[g+"/"+res], r.Verbs...)
			}
		}
	}
	for k := range got {
		slices.Sort(got[k])
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("role.yaml grants %v, the provider asks for %v", got, want)
	}
}
