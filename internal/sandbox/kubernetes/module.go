package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	authclient "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/module"
)

// The kubernetes provider as a module of toolhost's configuration: its keys
// (kubernetes.*), their validation, the provider they make with the sandbox policy every
// provider honours (limits, session lifetime), and its doctor lines.
func init() {
	module.RegisterProvider(module.Provider[Section]{
		Name:     "kubernetes",
		Prefix:   "kubernetes.",
		Sections: []module.Section{{Name: "kubernetes", Doc: sectionDoc}},
		Keys:     keys,
		Config:   DefaultSection,
		Validate: func(cfg *Section, s module.Settings) error { return cfg.Validate(s) },
		New: func(_ context.Context, cfg *Section, env module.Env) (sandbox.Provider, error) {
			p, err := NewFromSection(cfg, env)
			if err != nil {
				return nil, err
			}
			return p, nil
		},
		Doctor: func(ctx context.Context, cfg *Section, env module.Env, alone bool) []module.Check {
			return doctor(ctx, cfg, env, alone)
		},
	})
}

// Section is the kubernetes.* keys.
type Section struct {
	Kubeconfig      string              `key:"kubeconfig"`
	Context         string              `key:"context"`
	Namespace       string              `key:"namespace"`
	Image           string              `key:"image"`
	ImagePullPolicy string              `key:"image_pull_policy"`
	RuntimeClass    string              `key:"runtime_class"`
	NodeSelector    map[string]string   `key:"node_selector"`
	Tolerations     []SectionToleration `key:"tolerations"`
	Labels          map[string]string   `key:"labels"`
	NetworkPolicy   bool                `key:"network_policy"`
	EgressListen    string              `key:"egress_listen"`
	EgressAddress   string              `key:"egress_address"`
	RequestRatio    float64             `key:"request_ratio"`
	ReadyTimeout    time.Duration       `key:"ready_timeout"`
	RequestTimeout  time.Duration       `key:"request_timeout"`
}

// SectionToleration is an entry of kubernetes.tolerations.
type SectionToleration struct {
	Key      string `key:"key"`
	Operator string `key:"operator"`
	Value    string `key:"value"`
	Effect   string `key:"effect"`
}

// DefaultSection is the kubernetes.* keys' defaults.
func DefaultSection() *Section {
	return &Section{
		Namespace:       DefaultNamespace,
		Image:           DefaultImage,
		ImagePullPolicy: string(corev1.PullIfNotPresent),
		NodeSelector:    map[string]string{},
		Tolerations:     []SectionToleration{},
		Labels:          map[string]string{},
		RequestRatio:    DefaultRequestRatio,
		ReadyTimeout:    DefaultReadyTimeout,
		RequestTimeout:  DefaultRequestTimeout,
	}
}

const sectionDoc = `The Kubernetes provider (sandbox.provider: kubernetes, or kubernetes in a list such as
kubernetes,local): each sandbox is an agent-sandbox Sandbox (sigs.k8s.io/agent-sandbox)
in a namespace of your cluster, a pod that runs toolhost's agent image, reached at the
pod's IP with an access token. Its files live as long as the pod: the work lives in the
snapshots. More: docs/KUBERNETES.md.`

var keys = []module.Key{
	{Name: "kubernetes.kubeconfig", Flag: "kubernetes-kubeconfig", Default: `"" (in a pod: its service account; else $KUBECONFIG, else ~/.kube/config)`,
		Usage: "kubeconfig of the cluster the kubernetes provider uses", HostPath: true,
		Doc: `The kubeconfig file of the cluster. Empty: in a pod, the pod's service account (in-cluster);
elsewhere $KUBECONFIG, else ~/.kube/config.`},
	{Name: "kubernetes.context", Flag: "kubernetes-context", Default: `"" (the kubeconfig's current context)`,
		Usage: "context of the kubeconfig to use",
		Doc:   `The context of the kubeconfig to use; empty: its current context.`},
	{Name: "kubernetes.namespace", Flag: "kubernetes-namespace",
		Usage: "namespace the kubernetes provider makes its Sandboxes in",
		Doc: `The namespace Sandboxes are made in. The provider's user needs the Role of
deploy/kubernetes-sandboxes/role.yaml there, and nothing cluster-wide.`},
	{Name: "kubernetes.image", Flag: "kubernetes-image",
		Usage: "the agent image sandbox pods run (scripts/k8s/image.sh builds it)",
		Doc: `The container image each sandbox pod runs: toolhost's agent (cmd/toolhost-agent) with the
tools the sandboxes need. The default is the image scripts/k8s/image.sh builds from this
release, reproducibly, named by its digest as the test cluster imports it; no registry
serves it: build it (the same digest), push it to your registry with its manifest
(skopeo copy oci-archive:...) and name it here by digest (REGISTRY/toolhost-agent@sha256:...),
or import it into your nodes' containerd as it is.`},
	{Name: "kubernetes.image_pull_policy", Flag: "kubernetes-image-pull-policy",
		Usage: "the pods' imagePullPolicy: IfNotPresent, Always or Never",
		Doc:   `The pods' imagePullPolicy: IfNotPresent, Always or Never.`},
	{Name: "kubernetes.runtime_class", Flag: "kubernetes-runtime-class", Default: `"" (the cluster's default runtime)`,
		Usage: "RuntimeClass of sandbox pods (gvisor, kata, ...)",
		Doc: `The RuntimeClass of sandbox pods: a gVisor or Kata Containers class puts each sandbox
behind its own kernel. Empty: the cluster's default runtime (runc: the node's kernel).`},
	{Name: "kubernetes.node_selector", FileOnly: true, Example: "For example:\nnode_selector:\n  pool: sandboxes",
		Doc: `Node labels sandbox pods must land on (the pod's nodeSelector). No environment variable
or flag; set it here.`},
	{Name: "kubernetes.tolerations", FileOnly: true, Example: "For example:\n- key: sandboxes\n  operator: Exists\n  effect: NoSchedule",
		Doc: `Tolerations of sandbox pods (key, operator Exists or Equal, value, effect), for a node pool
tainted for sandboxes. No environment variable or flag; set it here.`},
	{Name: "kubernetes.labels", FileOnly: true, Example: "For example:\nlabels:\n  team: web",
		Doc: `Labels added to every Sandbox and its pod; toolhost adds app.kubernetes.io/managed-by:
toolhost, toolhost.dev/sandbox, toolhost.dev/network and the session's labels (project,
lease epoch) where they are valid label values. No environment variable or flag; set it here.`},
	{Name: "kubernetes.network_policy", Flag: "kubernetes-network-policy",
		Usage: "the namespace has deploy/kubernetes-sandboxes' NetworkPolicies, enforced",
		Doc: `Say true once the namespace has the NetworkPolicies of deploy/kubernetes-sandboxes
(networkpolicy.yaml for sandbox.network none, networkpolicy-egress.yaml for egress) and
the cluster's network plugin enforces them: sandbox pods then reach nothing, or only the
egress relay. While it is false, the provider refuses sandboxes with network none or
egress (a pod would have the cluster's network); sandbox.network: host gives them the pod
network as it is. toolhost doctor checks whether the cluster enforces them.`},
	{Name: "kubernetes.egress_listen", Flag: "kubernetes-egress-listen", Default: `"" (sandbox.network egress is refused)`,
		Usage: "where the egress relay for sandbox pods listens (host:port)",
		Doc: `Where toolhost listens (host:port) for the connections of sandbox pods with
sandbox.network: egress: each pod's agent carries its sandbox's connections here, and the
egress gateway decides each as for a local sandbox. It must be reachable from the pods
(and, with the NetworkPolicy, the only thing they reach). Empty: sandboxes with network
egress are refused.`},
	{Name: "kubernetes.egress_address", Flag: "kubernetes-egress-address", Default: `"" (kubernetes.egress_listen, when it names an address)`,
		Usage: "the address sandbox pods dial to reach the egress relay (host:port)",
		Doc: `The address sandbox pods dial to reach the egress relay (host:port): this host's
address on the pod network, or its pod's IP (a Deployment: the downward API's
status.podIP in the variable). Empty: kubernetes.egress_listen, which must then name an
address (not 0.0.0.0).`},
	{Name: "kubernetes.request_ratio", Flag: "kubernetes-request-ratio",
		Usage: "the pods' resource requests as a fraction of their limits",
		Doc: `sandbox.memory, sandbox.cpus and sandbox.disk are each pod's limits; its requests (what
the scheduler reserves) are this fraction of them, between 0 and 1.`},
	{Name: "kubernetes.ready_timeout", Flag: "kubernetes-ready-timeout",
		Usage: "bound of the wait for a new sandbox's pod to run its agent",
		Doc: `The bound of the wait for a new Sandbox's pod to be scheduled, pull its image and answer;
past it the Sandbox is deleted and the provider is unavailable (a list goes on). An image
that cannot be pulled fails at once.`},
	{Name: "kubernetes.request_timeout", Flag: "kubernetes-request-timeout",
		Usage: "bound of each call to the Kubernetes API server",
		Doc: `The bound of each call to the Kubernetes API server; an unreachable one makes the
provider unavailable within it.`},
}

// Validate checks the kubernetes.* keys.
func (s *Section) Validate(set module.Settings) error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	chosen := slices.Contains(set.Providers, "kubernetes")
	if chosen && strings.TrimSpace(s.Image) == "" {
		return bad("kubernetes.image", "is required with the kubernetes provider: the agent image its pods run (scripts/k8s/image.sh builds it; docs/KUBERNETES.md)")
	}
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return bad("kubernetes.namespace", "%q is not a namespace name: %s", s.Namespace, strings.Join(errs, "; "))
	}
	switch corev1.PullPolicy(s.ImagePullPolicy) {
	case corev1.PullIfNotPresent, corev1.PullAlways, corev1.PullNever:
	default:
		return bad("kubernetes.image_pull_policy", "must be IfNotPresent, Always or Never, got %q", s.ImagePullPolicy)
	}
	if s.RuntimeClass != "" {
		if errs := validation.IsDNS1123Subdomain(s.RuntimeClass); len(errs) > 0 {
			return bad("kubernetes.runtime_class", "%q is not a RuntimeClass name: %s", s.RuntimeClass, strings.Join(errs, "; "))
		}
	}
	for _, m := range []struct {
		key string
		m   map[string]string
	}{{"kubernetes.node_selector", s.NodeSelector}, {"kubernetes.labels", s.Labels}} {
		for _, k := range slices.Sorted(maps.Keys(m.m)) {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return bad(m.key, "%q is not a label name: %s", k, strings.Join(errs, "; "))
			}
			if errs := validation.IsValidLabelValue(m.m[k]); len(errs) > 0 {
				return bad(m.key, "the value of %q is not a label value: %s", k, strings.Join(errs, "; "))
			}
		}
	}
	for i, t := range s.Tolerations {
		switch t.Operator {
		case "", "Equal", "Exists":
		default:
			return bad(fmt.Sprintf("kubernetes.tolerations[%d]", i), "operator must be Exists or Equal, got %q", t.Operator)
		}
		switch t.Effect {
		case "", "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			return bad(fmt.Sprintf("kubernetes.tolerations[%d]", i), "effect must be NoSchedule, PreferNoSchedule, NoExecute or empty, got %q", t.Effect)
		}
	}
	for _, a := range []struct{ key, v string }{{"kubernetes.egress_listen", s.EgressListen}, {"kubernetes.egress_address", s.EgressAddress}} {
		if a.v == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(a.v); err != nil || port == "" {
			return bad(a.key, "%q is not host:port", a.v)
		}
	}
	if s.EgressAddress != "" && s.EgressListen == "" {
		return bad("kubernetes.egress_address", "is set without kubernetes.egress_listen, where the relay listens")
	}
	if s.RequestRatio <= 0 || s.RequestRatio > 1 {
		return bad("kubernetes.request_ratio", "must be more than 0 and at most 1, got %g", s.RequestRatio)
	}
	if s.ReadyTimeout <= 0 {
		return bad("kubernetes.ready_timeout", "must be positive, got %s", s.ReadyTimeout)
	}
	if s.RequestTimeout <= 0 {
		return bad("kubernetes.request_timeout", "must be positive, got %s", s.RequestTimeout)
	}
	return nil
}

// ProviderConfig is the provider's Config of the kubernetes.* keys and the settings.
func (s *Section) ProviderConfig(env module.Env) Config {
	set := env.Settings
	var tols []Toleration
	for _, t := range s.Tolerations {
		tols = append(tols, Toleration(t))
	}
	return Config{
		Kubeconfig: s.Kubeconfig, Context: s.Context, Namespace: s.Namespace,
		Image: s.Image, ImagePullPolicy: s.ImagePullPolicy, RuntimeClass: s.RuntimeClass,
		NodeSelector: s.NodeSelector, Tolerations: tols, Labels: s.Labels,
		NetworkPolicy: s.NetworkPolicy,
		EgressListen:  s.EgressListen, EgressAddress: s.EgressAddress,
		Limits:         Limits{MemoryBytes: set.MemoryBytes, CPUs: set.CPUs, DiskBytes: set.DiskBytes},
		RequestRatio:   s.RequestRatio,
		DefaultTimeout: set.TTL, MaxLifetime: set.MaxLifetime,
		Pool:         set.Pool,
		ReadyTimeout: s.ReadyTimeout, RequestTimeout: s.RequestTimeout,
		Logger: env.Logger,
	}
}

// NewFromSection is the provider of the kubernetes.* keys.
func NewFromSection(s *Section, env module.Env) (*Provider, error) {
	p, err := New(s.ProviderConfig(env))
	if err != nil {
		return nil, fmt.Errorf("kubernetes sandbox provider: %w", err)
	}
	return p, nil
}

// Rule is what the provider asks of the API server about one resource.
type Rule struct {
	Group, Resource string
	Verbs           []string
}

// Verbs are what the provider asks of the API server, by resource; PoolVerbs what it asks
// more with a warm pool (sandbox.pool): together, exactly the rules of
// deploy/kubernetes-sandboxes/role.yaml.
var (
	Verbs = []Rule{
		{SandboxResource.Group, SandboxResource.Resource, []string{"create", "get", "list", "patch", "delete"}},
		{"", "pods", []string{"get"}},
	}
	PoolVerbs = []Rule{
		{ClaimResource.Group, ClaimResource.Resource, []string{"create", "get", "list", "patch", "delete"}},
		{TemplateResource.Group, TemplateResource.Resource, []string{"create", "get"}},
		{WarmPoolResource.Group, WarmPoolResource.Resource, []string{"create", "get", "patch"}},
	}
)

// doctor checks that the API server answers, that agent-sandbox's Sandbox resource is
// installed, and that the provider's user may do each thing it does in the namespace
// (SelfSubjectAccessReview, which every user may ask); and says what it cannot check.
func doctor(ctx context.Context, s *Section, env module.Env, alone bool) []module.Check {
	c := module.Check{Name: "kubernetes", Needed: alone}
	p, err := NewFromSection(s, env)
	if err != nil {
		c.Detail = err.Error()
		return []module.Check{c}
	}
	cctx, cancel := context.WithTimeout(ctx, s.RequestTimeout)
	defer cancel()
	c.OK, c.Detail = p.Check(cctx)
	cancel()
	nc := module.Check{Name: "kubernetes network", OK: s.NetworkPolicy}
	switch {
	case !s.NetworkPolicy:
		nc.Detail = "kubernetes.network_policy is false: sandboxes with sandbox.network none or egress are refused; apply deploy/kubernetes-sandboxes' NetworkPolicies with a network plugin that enforces them, then set it true (docs/KUBERNETES.md#network)"
	case !c.OK:
		nc.OK = false
		nc.Detail = "kubernetes.network_policy is true, but whether the cluster enforces NetworkPolicy cannot be checked while the cluster is out of reach (above)"
	default:
		// Sandboxes of network none and egress are kept from the network by the
		// NetworkPolicy alone: when nothing enforces it, they reach everything the pod
		// network does, the gateway bypassed. Probe it (probe.go).
		pctx, pcancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout+time.Minute)
		enforced, detail := p.ProbeNetworkPolicy(pctx)
		pcancel()
		nc.OK, nc.Detail = enforced, detail
		// A cluster that lets a sandbox around its policy cannot honour the network
		// modes the configuration asks for.
		nc.Needed = alone && !enforced && (env.Settings.Network == sandbox.NetworkNone || env.Settings.Network == sandbox.NetworkEgress)
	}
	if s.NetworkPolicy && env.Settings.Network == sandbox.NetworkEgress && s.EgressListen == "" {
		nc.OK, nc.Needed = false, alone
		nc.Detail = "sandbox.network is egress, but kubernetes.egress_listen is empty: sandbox pods have no way to the egress gateway, and such sandboxes are refused (docs/KUBERNETES.md#network)"
	}
	return []module.Check{c, nc}
}

// Check asks the API server whether the provider can work: the Sandbox resource is
// installed and its user may do what it does in the namespace. It returns a line that
// says what it found, or what to do.
func (p *Provider) Check(ctx context.Context) (bool, string) {
	if _, err := p.dyn.Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return false, fmt.Sprintf("listing Sandboxes in namespace %s: %v", p.cfg.Namespace, p.explain(err))
	}
	rules := Verbs
	if p.cfg.Pool > 0 {
		if _, err := p.claims.Namespace(p.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return false, fmt.Sprintf("listing SandboxClaims in namespace %s (sandbox.pool is %d): %v", p.cfg.Namespace, p.cfg.Pool, p.explainFor(err, missingExtensions))
		}
		rules = append(slices.Clone(Verbs), PoolVerbs...)
	}
	ac, err := authclient.NewForConfig(p.rest)
	if err != nil {
		return false, err.Error()
	}
	var missing []string
	for _, r := range rules {
		for _, v := range r.Verbs {
			rev, err := ac.SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authv1.ResourceAttributes{Namespace: p.cfg.Namespace, Verb: v, Group: r.Group, Resource: r.Resource},
			}}, metav1.CreateOptions{})
			if err != nil {
				return false, fmt.Sprintf("asking the API server at %s what the user may do: %v", p.server, p.explain(err))
			}
			if !rev.Status.Allowed {
				missing = append(missing, v+" "+r.Resource)
			}
		}
	}
	if len(missing) > 0 {
		return false, fmt.Sprintf("the user may not %s in namespace %s: bind it the Role of deploy/kubernetes-sandboxes/role.yaml", strings.Join(missing, ", "), p.cfg.Namespace)
	}
	what := "agent-sandbox's Sandbox resource is installed"
	if p.cfg.Pool > 0 {
		what = fmt.Sprintf("agent-sandbox's Sandbox resource and extensions are installed (a warm pool of %d per network mode)", p.cfg.Pool)
	}
	return true, fmt.Sprintf("the API server at %s answers, %s, and the user may do what the provider does in namespace %s (image %s)",
		p.server, what, p.cfg.Namespace, p.cfg.Image)
}
