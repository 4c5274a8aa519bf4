package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
)

// Warm spares (sandbox.pool, Config.Pool) through agent-sandbox's extensions: the pod
// template the provider writes is a SandboxTemplate, a SandboxWarmPool keeps Pool pods of
// it running, and each sandbox is a SandboxClaim against the template, which the
// extensions' controller binds to a Sandbox of the claim's name that adopts a warm pod
// (fast) or makes a new one from the template.
//
// The access token stays the sandbox's own. A warm pod is made before any claim, so its
// template cannot hold a sandbox's token: it holds the pool's (envPoolToken), the same in
// every pod of the pool, with which an agent does one thing only: be claimed, once
// (envd.PathClaim). The provider, having claimed a pod, sends its agent the pod's name
// (checked by the agent against its own: a stale address claims nothing), the sandbox's
// own token (random, in the claim's annotation for a replica that takes the project over)
// and its environment; the agent then answers that token alone and forgets the pool's.
// So the shared token never runs anything, a sandbox's code never runs before its agent
// is claimed, and a sandbox that learns its own token learns nobody else's.
//
// The template and the pool are named by a hash of everything in the template but the
// pool's token, per network mode: replicas with the same configuration share them, and
// the first to need one makes it (the others read its token). They are left in the
// namespace when toolhost stops (spares are the point); a changed configuration makes new
// ones, and the old are the operator's to delete (docs/KUBERNETES.md).

// The extensions' resources.
var (
	ClaimResource    = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxclaims"}
	TemplateResource = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxtemplates"}
	WarmPoolResource = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxwarmpools"}
)

const (
	// envPoolToken and envPod give a warm pod's agent the pool's token and its pod's name
	// (cmd/toolhost-agent).
	envPoolToken = "TOOLHOST_AGENT_POOL_TOKEN"
	envPod       = "TOOLHOST_AGENT_POD"
	// annotationToken is a claim's sandbox token, for a replica that reconnects.
	annotationToken = "toolhost.dev/token"
	// annotationPodName is agent-sandbox's: the pod of a Sandbox that adopted a warm pod.
	annotationPodName = "agents.x-k8s.io/pod-name"
	// missingExtensions says what to do when the extensions are not installed.
	missingExtensions = "SandboxClaim, SandboxTemplate or SandboxWarmPool resource (extensions.agents.x-k8s.io/v1alpha1), which sandbox.pool needs: install agent-sandbox's extensions and run its controller with --extensions, or set sandbox.pool to 0"
	// tokenBytes is the size of a token, in random bytes.
	tokenBytes = 32
)

// warmPool is the template (and pool, of the same name) of a network mode, and the pool's
// token.
type warmPool struct {
	template string
	token    string
}

// poolAuth are the variables of a warm pod's agent: the pool's token and its pod's name.
func poolAuth(token string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: envPoolToken, Value: token},
		{Name: envPod, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
	}
}

// templateFor is the SandboxTemplate of a network mode with the pool's token; its name
// hashes everything in it but the token.
func (p *Provider) templateFor(network, token string) (*unstructured.Unstructured, error) {
	labels := p.labelsFor(sandbox.CreateOptions{}, network)
	relay := ""
	if network == sandbox.NetworkEgress {
		r, err := p.egressRelay()
		if err != nil {
			return nil, err
		}
		relay = r.addr
	}
	spec := p.podSpec(poolAuth(token), nil, relay)
	podSpec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		return nil, err
	}
	shape, err := json.Marshal(map[string]any{"labels": labels, "spec": p.podSpec(poolAuth(""), nil, relay)})
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(shape)
	name := "toolhost-" + network + "-" + hex.EncodeToString(sum[:])[:12]
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": TemplateResource.GroupVersion().String(),
		"kind":       "SandboxTemplate",
		"metadata":   map[string]any{"name": name, "namespace": p.cfg.Namespace, "labels": toAny(labels)},
		"spec": map[string]any{
			"podTemplate": map[string]any{"metadata": map[string]any{"labels": toAny(labels)}, "spec": podSpec},
		},
	}}, nil
}

// poolTokenOf is the pool's token in a SandboxTemplate of the provider's.
func poolTokenOf(u *unstructured.Unstructured) (string, error) {
	if u.GetLabels()[LabelManagedBy] != managedBy {
		return "", fmt.Errorf("SandboxTemplate %s was not made by toolhost: %w", u.GetName(), sandbox.ErrForeign)
	}
	if tok := containerEnv(u.Object, envPoolToken, "spec", "podTemplate", "spec", "containers"); len(tok) >= 2*tokenBytes {
		return tok, nil
	}
	return "", fmt.Errorf("SandboxTemplate %s has no pool token: %w", u.GetName(), sandbox.ErrForeign)
}

// containerEnv is the value of the agent container's variable name in the containers at
// path of obj, or "".
func containerEnv(obj map[string]any, name string, path ...string) string {
	containers, _, _ := unstructured.NestedSlice(obj, path...)
	for _, c := range containers {
		cm, _ := c.(map[string]any)
		if cm["name"] != containerName {
			continue
		}
		env, _ := cm["env"].([]any)
		for _, e := range env {
			em, _ := e.(map[string]any)
			if em["name"] == name {
				v, _ := em["value"].(string)
				return v
			}
		}
	}
	return ""
}

// ensurePool makes (or finds) the SandboxTemplate and SandboxWarmPool of a network mode,
// with Pool replicas, once per provider.
func (p *Provider) ensurePool(ctx context.Context, network string) (warmPool, error) {
	p.warmMu.Lock()
	defer p.warmMu.Unlock()
	if w, ok := p.warm[network]; ok {
		return w, nil
	}
	obj, err := p.templateFor(network, randomHex(tokenBytes))
	if err != nil {
		return warmPool{}, err
	}
	name := obj.GetName()
	ns := p.cfg.Namespace
	ctx, cancel := context.WithTimeout(ctx, 2*p.cfg.RequestTimeout)
	defer cancel()
	u, err := p.templates.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		u, err = p.templates.Namespace(ns).Create(ctx, obj, metav1.CreateOptions{FieldManager: managedBy})
		if apierrors.IsAlreadyExists(err) { // another replica's, just made
			u, err = p.templates.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return warmPool{}, fmt.Errorf("SandboxTemplate %s/%s: %w", ns, name, p.explainFor(err, missingExtensions))
	}
	token, err := poolTokenOf(u)
	if err != nil {
		return warmPool{}, err
	}
	replicas := int64(p.cfg.Pool)
	pool, err := p.pools.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pool, err = p.pools.Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": WarmPoolResource.GroupVersion().String(),
			"kind":       "SandboxWarmPool",
			"metadata":   map[string]any{"name": name, "namespace": ns, "labels": toAny(map[string]string{LabelManagedBy: managedBy})},
			"spec":       map[string]any{"replicas": replicas, "sandboxTemplateRef": map[string]any{"name": name}},
		}}, metav1.CreateOptions{FieldManager: managedBy})
		if apierrors.IsAlreadyExists(err) {
			pool, err = p.pools.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return warmPool{}, fmt.Errorf("SandboxWarmPool %s/%s: %w", ns, name, p.explainFor(err, missingExtensions))
	}
	if have, _, _ := unstructured.NestedInt64(pool.Object, "spec", "replicas"); have != replicas {
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"replicas": replicas}})
		if _, err := p.pools.Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managedBy}); err != nil {
			return warmPool{}, fmt.Errorf("SandboxWarmPool %s/%s: set its replicas to sandbox.pool (%d): %w", ns, name, replicas, p.explainFor(err, missingExtensions))
		}
	}
	w := warmPool{template: name, token: token}
	p.warm[network] = w
	p.log.Info("Kubernetes warm pool ready", "pool", name, "replicas", replicas)
	return w, nil
}

// Warm makes (or finds) the SandboxTemplate and SandboxWarmPool of opts' network mode, so
// that spares start before the first sandbox is asked for; Create does it when it has
// not been. Without a pool (Config.Pool 0) it does nothing.
func (p *Provider) Warm(ctx context.Context, opts sandbox.CreateOptions) error {
	if p.cfg.Pool <= 0 {
		return nil
	}
	network := opts.Network
	if network == "" {
		network = sandbox.NetworkNone
	}
	if _, err := p.ensurePool(ctx, network); err != nil {
		return fmt.Errorf("warm Kubernetes sandboxes: %w", err)
	}
	return nil
}

// Spares is how many spares of opts' network mode the warm pool has ready (its
// status.readyReplicas, as the controller last wrote it).
func (p *Provider) Spares(ctx context.Context, opts sandbox.CreateOptions) (int, error) {
	if p.cfg.Pool <= 0 {
		return 0, nil
	}
	network := opts.Network
	if network == "" {
		network = sandbox.NetworkNone
	}
	w, err := p.ensurePool(ctx, network)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	u, err := p.pools.Namespace(p.cfg.Namespace).Get(ctx, w.template, metav1.GetOptions{})
	if err != nil {
		return 0, p.explainFor(err, missingExtensions)
	}
	n, _, _ := unstructured.NestedInt64(u.Object, "status", "readyReplicas")
	return int(n), nil
}

// createClaimed makes a sandbox as a SandboxClaim against the warm pool's template and
// returns once its agent is claimed and answers the sandbox's own token, within
// ReadyTimeout.
func (p *Provider) createClaimed(ctx context.Context, opts sandbox.CreateOptions, network string, timeout time.Duration) (sandbox.Sandbox, error) {
	began := time.Now()
	w, err := p.ensurePool(ctx, network)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes sandbox: %w", err)
	}
	name := "toolhost-" + randomHex(6)
	token := randomHex(tokenBytes)
	link, err := p.openEgress(opts, name, token)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes sandbox: %w", err)
	}
	all, _ := json.Marshal(opts.Labels)
	if opts.Labels == nil {
		all = []byte("{}")
	}
	end := endAfter(timeout + p.cfg.ReadyTimeout) // as Create's: moved once the agent answers
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ClaimResource.GroupVersion().String(),
		"kind":       "SandboxClaim",
		"metadata": map[string]any{
			"name":        name,
			"namespace":   p.cfg.Namespace,
			"labels":      toAny(p.labelsFor(opts, network)),
			"annotations": map[string]any{annotationLabels: string(all), annotationToken: token},
		},
		"spec": map[string]any{
			"sandboxTemplateRef": map[string]any{"name": w.template},
			"lifecycle":          map[string]any{"shutdownTime": end.UTC().Format(time.RFC3339), "shutdownPolicy": "Delete"},
		},
	}}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	created, err := p.claims.Namespace(p.cfg.Namespace).Create(cctx, obj, metav1.CreateOptions{FieldManager: managedBy})
	cancel()
	if err != nil {
		link.close()
		return nil, fmt.Errorf("create Kubernetes sandbox in namespace %s: %w", p.cfg.Namespace, p.explainFor(err, missingExtensions))
	}
	startedAt := created.GetCreationTimestamp().Time
	var pod string
	sb, err := p.waitPod(ctx, began, "the claim has no Sandbox yet: is the agent-sandbox controller running with --extensions?",
		func(ctx context.Context) (string, string, error) { return p.claimedPod(ctx, name, created.GetUID()) },
		func(ctx context.Context, podName, ip string) (*Sandbox, error) {
			pod = podName
			return p.claimAgent(ctx, name, podName, ip, w.token, token, link.env(opts.Env))
		})
	if err == nil {
		if err = link.giveTrust(ctx, sb, p.cfg.RequestTimeout); err != nil {
			sb.detach()
		}
	}
	if err != nil {
		link.close()
		p.deleteQuietly(context.WithoutCancel(ctx), name, true, "could not be set up")
		return nil, fmt.Errorf("create Kubernetes sandbox %s: %w", name, err)
	}
	sb.claimed = true
	sb.egress = link
	end = endAfter(timeout)
	if err := p.patchShutdown(ctx, name, true, end); err != nil {
		sb.detach()
		p.deleteQuietly(context.WithoutCancel(ctx), name, true, "could not be given its end time")
		return nil, fmt.Errorf("create Kubernetes sandbox %s: setting its end time: %w", name, err)
	}
	sb.start(startedAt, end)
	p.log.Info("Kubernetes sandbox claimed", "sandbox", name, "pod", pod, "namespace", p.cfg.Namespace, "pod_ip", sb.podIP,
		"ends", end.UTC().Format(time.RFC3339), "took", time.Since(began))
	return sb, nil
}

// claimedPod is the pod of the Sandbox a claim (of uid) is bound to: "" and what it waits
// for while there is none.
func (p *Provider) claimedPod(ctx context.Context, name string, uid types.UID) (string, string, error) {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	u, err := p.dyn.Namespace(p.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", "the claim has no Sandbox yet: is the agent-sandbox controller running with --extensions?", nil
	}
	if err != nil {
		return "", "", err
	}
	return podOf(u, uid)
}

// podOf is the pod of a Sandbox that the claim of uid controls: the warm pod it adopted,
// else its own of its name.
func podOf(u *unstructured.Unstructured, uid types.UID) (string, string, error) {
	owned := false
	for _, o := range u.GetOwnerReferences() {
		if o.Controller != nil && *o.Controller && o.Kind == "SandboxClaim" && o.UID == uid {
			owned = true
		}
	}
	if !owned {
		return "", "", fmt.Errorf("Sandbox %s is not its claim's: %w", u.GetName(), sandbox.ErrForeign)
	}
	if pod := u.GetAnnotations()[annotationPodName]; pod != "" {
		return pod, "", nil
	}
	return u.GetName(), "", nil
}

// claimAgent claims the agent of a warm pod (or of a pod made from the template) at ip:
// with the pool's token, it gives the agent the sandbox's token and environment, then
// reaches it with that token. A claim already made by an earlier try of this one (its
// answer lost) is recognised by the token working.
func (p *Provider) claimAgent(ctx context.Context, name, pod, ip, poolToken, token string, env map[string]string) (*Sandbox, error) {
	pc, err := agentClient(ip, poolToken)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	claimErr := pc.Claim(cctx, envd.ClaimRequest{Pod: pod, Token: token, Env: env})
	cancel()
	pc.Close()
	sb, err := p.open(ctx, name, token, ip)
	if err != nil {
		return nil, err
	}
	if claimErr != nil {
		// Health answers anyone: only a call that needs the token tells it was ours.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := sb.client.Processes(cctx)
		cancel()
		if err != nil {
			sb.detach()
			return nil, fmt.Errorf("claim the agent of pod %s: %w", pod, claimErr)
		}
	}
	sb.claimed = true
	return sb, nil
}

// readClaim parses a SandboxClaim; one not made by the provider gives an error wrapping
// sandbox.ErrForeign.
func readClaim(u *unstructured.Unstructured) (found, error) {
	f := found{name: u.GetName(), startedAt: u.GetCreationTimestamp().Time, claimed: true, uid: u.GetUID(), network: u.GetLabels()[LabelNetwork]}
	if u.GetLabels()[LabelManagedBy] != managedBy {
		return f, fmt.Errorf("SandboxClaim %s was not made by toolhost: %w", f.name, sandbox.ErrForeign)
	}
	if err := json.Unmarshal([]byte(u.GetAnnotations()[annotationLabels]), &f.labels); err != nil {
		return f, fmt.Errorf("SandboxClaim %s: its labels annotation: %v: %w", f.name, err, sandbox.ErrForeign)
	}
	if t, ok, _ := unstructured.NestedString(u.Object, "spec", "lifecycle", "shutdownTime"); ok {
		if end, err := time.Parse(time.RFC3339, t); err == nil {
			f.endsAt = end
		}
	}
	if tok := u.GetAnnotations()[annotationToken]; len(tok) >= 2*tokenBytes {
		f.token = tok
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Ready" && (cm["reason"] == "ClaimExpired" || cm["reason"] == "SandboxExpired") {
			f.gone = "expired"
		}
	}
	f.settle(u)
	return f, nil
}
