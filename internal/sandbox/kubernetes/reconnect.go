package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/toolhost/toolhost/core/sandbox"
)

// What another replica finds of a Sandbox: a replica that takes a project over (the
// fleet) reconnects to the project's Sandbox by its name, checking the labels its
// session gave it (the project, the lease's epoch); everything read from the cluster is
// checked as a record that may be stale.

// found is a Sandbox of the provider's, as read from the cluster.
type found struct {
	name      string
	labels    map[string]string // the session's (CreateOptions.Labels)
	startedAt time.Time
	endsAt    time.Time
	token     string
	gone      string // why it cannot be reached again; "" when it can
	claimed   bool   // a SandboxClaim (pool.go), not a Sandbox
	network   string // LabelNetwork: the sandbox's network mode
	uid       types.UID
}

// settle says why a sandbox read from u cannot be reached again, if it cannot.
func (f *found) settle(u *unstructured.Unstructured) {
	switch {
	case u.GetDeletionTimestamp() != nil:
		f.gone = "being deleted"
	case !f.endsAt.IsZero() && time.Now().After(f.endsAt):
		f.gone = "past its end time"
	case f.token == "":
		f.gone = "without an agent token"
	}
}

// read parses a Sandbox; a Sandbox not made by the provider gives an error wrapping
// sandbox.ErrForeign.
func read(u *unstructured.Unstructured) (found, error) {
	f := found{name: u.GetName(), startedAt: u.GetCreationTimestamp().Time}
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "SandboxClaim" {
			return f, fmt.Errorf("Sandbox %s is SandboxClaim %s's: reach it through the claim, with sandbox.pool set as where it was made: %w", f.name, o.Name, sandbox.ErrForeign)
		}
	}
	if u.GetLabels()[LabelManagedBy] != managedBy {
		return f, fmt.Errorf("Sandbox %s was not made by toolhost: %w", f.name, sandbox.ErrForeign)
	}
	if err := json.Unmarshal([]byte(u.GetAnnotations()[annotationLabels]), &f.labels); err != nil {
		return f, fmt.Errorf("Sandbox %s: its labels annotation: %v: %w", f.name, err, sandbox.ErrForeign)
	}
	if t, ok, _ := unstructured.NestedString(u.Object, "spec", "shutdownTime"); ok {
		if end, err := time.Parse(time.RFC3339, t); err == nil {
			f.endsAt = end
		}
	}
	f.network = u.GetLabels()[LabelNetwork]
	f.token = containerEnv(u.Object, envToken, "spec", "podTemplate", "spec", "containers")
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Ready" && cm["reason"] == "SandboxExpired" {
			f.gone = "expired"
		}
	}
	f.settle(u)
	return f, nil
}

// lookup reads a sandbox of the provider by name: with a pool, its SandboxClaim if there
// is one; else its Sandbox. pod is its pod's name ("" when it has none yet).
func (p *Provider) lookup(ctx context.Context, id string) (f found, pod string, err error) {
	ns := p.cfg.Namespace
	var claimGone error // with a pool: the claim id is not there (NotFound)
	if p.cfg.Pool > 0 {
		cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
		u, err := p.claims.Namespace(ns).Get(cctx, id, metav1.GetOptions{})
		cancel()
		switch {
		case err == nil:
			if f, err = readClaim(u); err != nil {
				return f, "", err
			}
			cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
			sb, err := p.dyn.Namespace(ns).Get(cctx, id, metav1.GetOptions{})
			cancel()
			if apierrors.IsNotFound(err) {
				return f, "", nil
			}
			if err != nil {
				return f, "", p.explain(err)
			}
			pod, _, err := podOf(sb, f.uid)
			return f, pod, err
		case !apierrors.IsNotFound(err):
			return f, "", p.explainFor(err, missingExtensions)
		}
		var st apierrors.APIStatus
		if errors.As(err, &st) && (st.Status().Details == nil || st.Status().Details.Name == "") {
			return f, "", p.explainFor(err, missingExtensions) // the resource, not the claim, is missing
		}
		claimGone = err
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	u, err := p.dyn.Namespace(ns).Get(cctx, id, metav1.GetOptions{})
	cancel()
	if err != nil {
		return f, "", p.explain(err)
	}
	if claimGone != nil && ownedByClaim(u, id) {
		// The claim was deleted and the garbage collector has not yet deleted its Sandbox
		// (owner references, in the background): the sandbox is gone, not another's.
		return f, "", claimGone
	}
	f, err = read(u)
	return f, id, err
}

// ownedByClaim reports whether Sandbox u belongs to the SandboxClaim named claim.
func ownedByClaim(u *unstructured.Unstructured, claim string) bool {
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "SandboxClaim" && o.Name == claim {
			return true
		}
	}
	return false
}

// hasLabels reports whether every label of want is in have, with its value.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// Reconnect attaches to a running Sandbox of the provider by its name, as another process
// left it (sandbox.Reconnector): its end time moves to now + opts.Timeout unless it is
// later already.
func (p *Provider) Reconnect(ctx context.Context, id string, opts sandbox.ReconnectOptions) (sandbox.Sandbox, error) {
	f, podName, err := p.lookup(ctx, id)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: no such Sandbox in namespace %s: %w", id, p.cfg.Namespace, sandbox.ErrGone)
	case errors.Is(err, sandbox.ErrForeign):
		return nil, fmt.Errorf("reconnect: %w", err)
	case err != nil:
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: %w", id, err)
	}
	if !hasLabels(f.labels, opts.Labels) {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: it lacks the labels asked for: %w", id, sandbox.ErrForeign)
	}
	if f.gone != "" {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: it is %s: %w", id, f.gone, sandbox.ErrGone)
	}
	if podName == "" {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: its claim holds no Sandbox: %w", id, sandbox.ErrGone)
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	pod, err := p.core.Pods(p.cfg.Namespace).Get(cctx, podName, metav1.GetOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: its pod is gone: %w", id, sandbox.ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: %w", id, p.explain(err))
	}
	if pod.Status.PodIP == "" || !podReady(pod) {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: its pod is not running (%s): %w", id, podState(pod), sandbox.ErrGone)
	}
	sb, err := p.open(ctx, id, f.token, pod.Status.PodIP)
	if err != nil {
		return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: its agent at %s: %w", id, pod.Status.PodIP, err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = p.cfg.DefaultTimeout
	}
	end := f.endsAt
	if want := endAfter(timeout); want.After(end) {
		end = want
		if limit := f.startedAt.Add(p.cfg.MaxLifetime); end.After(limit) {
			end = limit
		}
		if end.After(f.endsAt) {
			if err := p.patchShutdown(ctx, id, f.claimed, end); err != nil {
				sb.detach()
				return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: extend it: %w", id, err)
			}
		} else {
			end = f.endsAt
		}
	}
	sb.claimed = f.claimed
	sb.start(f.startedAt, end)
	if f.network == sandbox.NetworkEgress {
		if err := p.takeEgress(ctx, sb, opts.Egress); err != nil {
			sb.detach()
			return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: %w", id, err)
		}
	}
	if len(opts.SetLabels) > 0 {
		if err := p.relabel(ctx, f, opts.SetLabels); err != nil {
			sb.detach()
			return nil, fmt.Errorf("reconnect to Kubernetes sandbox %s: set its labels: %w", id, err)
		}
	}
	p.log.Info("reconnected to Kubernetes sandbox", "sandbox", id, "ends", end.UTC().Format(time.RFC3339))
	return sb, nil
}

// relabel sets labels on the Sandbox (or SandboxClaim) f: in the annotation Reconnect
// and List go by, and as Kubernetes labels those Kubernetes accepts (one whose new value
// it does not is removed, so that no label says the old value). The pod keeps the labels
// it was made with.
func (p *Provider) relabel(ctx context.Context, f found, set map[string]string) error {
	all := maps.Clone(f.labels)
	if all == nil {
		all = map[string]string{}
	}
	k8s := map[string]any{}
	for k, v := range set {
		if k == "" || len(k) > 256 || len(v) > 1024 || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("invalid label %q (a name of 1 to 256 bytes and a value of at most 1024, in UTF-8)", k)
		}
		all[k] = v
		name := labelPrefix + k
		switch {
		case len(validation.IsQualifiedName(name)) != 0:
		case len(validation.IsValidLabelValue(v)) == 0:
			k8s[name] = v
		default:
			k8s[name] = nil
		}
	}
	ann, _ := json.Marshal(all)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": k8s, "annotations": map[string]any{annotationLabels: string(ann)}}})
	res := p.dyn
	if f.claimed {
		res = p.claims
	}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	if _, err := res.Namespace(p.cfg.Namespace).Patch(cctx, f.name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managedBy}); err != nil {
		return p.explain(err)
	}
	return nil
}

// List lists the provider's Sandboxes in its namespace that carry every label of filter
// (sandbox.Lister), whichever process made them.
func (p *Provider) List(ctx context.Context, filter map[string]string) ([]sandbox.SandboxInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	l, err := p.dyn.Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + managedBy})
	if err != nil {
		return nil, fmt.Errorf("list Kubernetes sandboxes in namespace %s: %w", p.cfg.Namespace, p.explain(err))
	}
	var out []sandbox.SandboxInfo
	add := func(f found, err error) {
		if err == nil && f.gone == "" && hasLabels(f.labels, filter) {
			out = append(out, sandbox.SandboxInfo{ID: f.name, Labels: f.labels, State: "running", StartedAt: f.startedAt, EndsAt: f.endsAt})
		}
	}
	for i := range l.Items {
		add(read(&l.Items[i]))
	}
	if p.cfg.Pool > 0 {
		l, err := p.claims.Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + managedBy})
		if err != nil {
			return nil, fmt.Errorf("list Kubernetes sandboxes (SandboxClaims) in namespace %s: %w", p.cfg.Namespace, p.explainFor(err, missingExtensions))
		}
		for i := range l.Items {
			add(readClaim(&l.Items[i]))
		}
	}
	slices.SortFunc(out, func(a, b sandbox.SandboxInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out, nil
}

// Kill deletes one of the provider's Sandboxes by name (sandbox.Killer); one that is gone
// already is not an error.
func (p *Provider) Kill(ctx context.Context, id string) error {
	f, _, err := p.lookup(ctx, id)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case errors.Is(err, sandbox.ErrForeign):
		return fmt.Errorf("kill: %w", err)
	case err != nil:
		return fmt.Errorf("kill Kubernetes sandbox %s: %w", id, err)
	}
	if err := p.delete(ctx, id, f.claimed); err != nil {
		return fmt.Errorf("kill Kubernetes sandbox %s: %w", id, err)
	}
	return nil
}
