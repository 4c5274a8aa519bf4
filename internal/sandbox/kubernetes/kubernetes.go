// Package kubernetes is the sandbox provider for a Kubernetes cluster with agent-sandbox
// (sigs.k8s.io/agent-sandbox): every sandbox is a Sandbox resource, a singleton pod the
// agent-sandbox controller runs from the pod template the provider writes, whose one
// container runs toolhost's own agent (cmd/toolhost-agent, the envd protocol the local
// provider speaks). The host reaches the agent at the pod's IP, with an access token only
// it and the pod know, and everything the agent says is the sandbox's word: hostile input.
//
// A Sandbox's spec.shutdownTime is the sandbox's end time (extended by SetTimeout, as
// E2B's timeout is); its labels name toolhost, the provider and the session's labels (the
// project, the lease's epoch), so that another replica reconnects to it by name
// (sandbox.Reconnector), lists it (sandbox.Lister) and kills it (sandbox.Killer).
//
// Docs: docs/KUBERNETES.md (installing agent-sandbox, the Role, runtime classes, the
// NetworkPolicy, what differs from local and E2B).
package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/toolhost/toolhost/core/sandbox"
	"github.com/toolhost/toolhost/internal/envd"
	"github.com/toolhost/toolhost/internal/envd/client"
)

// SandboxResource is agent-sandbox's Sandbox.
var SandboxResource = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxes"}

// Labels and annotations the provider puts on its Sandboxes and their pods.
const (
	// LabelManagedBy is the standard label, with value "toolhost": the provider's own
	// Sandboxes, the only ones it reconnects to, lists or kills.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "toolhost"
	// LabelSandbox marks the pods (and Sandboxes) of sandboxes: what the NetworkPolicy of
	// deploy/kubernetes-sandboxes selects.
	LabelSandbox = "toolhost.dev/sandbox"
	// LabelNetwork is the sandbox's network mode (none or host).
	LabelNetwork = "toolhost.dev/network"
	// labelPrefix prefixes the session's labels (CreateOptions.Labels) that are valid
	// Kubernetes label names and values, for kubectl and selectors; annotationLabels holds
	// all of them, whatever they are, and is what Reconnect and List go by.
	labelPrefix      = "toolhost.dev/"
	annotationLabels = "toolhost.dev/labels"
)

// AgentPort is the port the agent listens on in the pod (envd's own).
const AgentPort = 49983

// envToken is the variable that gives the agent its access token (cmd/toolhost-agent).
const envToken = "TOOLHOST_AGENT_TOKEN"

// containerName is the agent's container in the pod.
const containerName = "agent"

// Toleration is a pod toleration of the configuration.
type Toleration struct {
	Key      string
	Operator string // Exists or Equal (default)
	Value    string
	Effect   string // NoSchedule, PreferNoSchedule, NoExecute or "" (all)
}

// Limits are the limits of each sandbox; -1 (or 0 for CPUs) means none.
type Limits struct {
	MemoryBytes int64
	CPUs        float64
	// DiskBytes bounds the pod's ephemeral storage (the workspace is an emptyDir).
	DiskBytes int64
}

// Config configures the provider.
type Config struct {
	// Kubeconfig is the kubeconfig file; empty: in the cluster (a pod's service account),
	// else $KUBECONFIG, else ~/.kube/config. Context picks a context of it.
	Kubeconfig string
	Context    string
	// Namespace is where Sandboxes are made (default "default").
	Namespace string
	// Image is the agent image the pod runs (required): scripts/k8s/image.sh builds it.
	Image string
	// ImagePullPolicy is the container's (default IfNotPresent).
	ImagePullPolicy string
	// RuntimeClass names the pods' RuntimeClass (gVisor, Kata); empty: the cluster's default.
	RuntimeClass string
	// NodeSelector, Tolerations and Labels go on every pod (Labels on the Sandbox too).
	NodeSelector map[string]string
	Tolerations  []Toleration
	Labels       map[string]string
	// NetworkPolicy says the namespace has the NetworkPolicies of
	// deploy/kubernetes-sandboxes (no egress for sandbox pods of network none, egress only
	// to the relay for those of network egress) and the cluster enforces them. Without it
	// the provider refuses sandboxes with network none or egress: a pod has the cluster's
	// network, and giving a sandbox more network than asked is refused.
	NetworkPolicy bool
	// EgressListen is where the provider's egress relay listens (host:port) for the pods of
	// sandboxes with network egress (egress.go); empty: such sandboxes are refused.
	// EgressAddress is the address pods dial to reach it (default: EgressListen's, when it
	// names a host).
	EgressListen  string
	EgressAddress string
	// Limits of each sandbox: the container's limits; its requests are RequestRatio of them.
	Limits       Limits
	RequestRatio float64
	// DefaultTimeout is a sandbox's life when CreateOptions.Timeout is zero (default 1h);
	// MaxLifetime bounds it and every extension (default 24h).
	DefaultTimeout time.Duration
	MaxLifetime    time.Duration
	// Pool is how many warm spares to keep (sandbox.pool): with it, each sandbox is a
	// SandboxClaim against a SandboxTemplate that a SandboxWarmPool of Pool pods keeps
	// ready (agent-sandbox's extensions: pool.go); without it, a Sandbox.
	Pool int
	// ReadyTimeout bounds the wait for a new sandbox's pod to run its agent (default 2m);
	// RequestTimeout each call to the API server (default 30s).
	ReadyTimeout   time.Duration
	RequestTimeout time.Duration
	Logger         *slog.Logger
}

// Defaults of Config.
const (
	DefaultNamespace      = "default"
	DefaultReadyTimeout   = 2 * time.Minute
	DefaultRequestTimeout = 30 * time.Second
	DefaultRequestRatio   = 0.25
)

// Provider creates sandboxes as agent-sandbox Sandboxes. It holds one resource of its own,
// the egress relay (made with the first sandbox with network egress; Close stops it).
type Provider struct {
	cfg  Config
	log  *slog.Logger
	rest *rest.Config
	dyn  dynamic.NamespaceableResourceInterface
	// claims, templates and pools are the extensions' resources (pool.go).
	claims, templates, pools dynamic.NamespaceableResourceInterface
	core                     corev1client.CoreV1Interface
	// server names the API server in messages.
	server string

	// warm holds the SandboxTemplate and pool ensured for each network mode (pool.go).
	warmMu sync.Mutex
	warm   map[string]warmPool

	relayMu     sync.Mutex
	relay       *relay // egress.go
	relayClosed bool
}

var (
	_ sandbox.Provider      = (*Provider)(nil)
	_ sandbox.Reconnector   = (*Provider)(nil)
	_ sandbox.Lister        = (*Provider)(nil)
	_ sandbox.Killer        = (*Provider)(nil)
	_ sandbox.LifetimeBound = (*Provider)(nil)
	_ sandbox.Closer        = (*Provider)(nil)
)

// RestConfig loads the client configuration Config names: a kubeconfig, or in the
// cluster.
func RestConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration: %w", err)
		}
		return rc, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return rc, nil
}

// New makes the provider; it does not reach the cluster (Create does, and says why it
// cannot).
func New(cfg Config) (*Provider, error) {
	if cfg.Image == "" {
		return nil, errors.New("no agent image configured (kubernetes.image; scripts/k8s/image.sh builds it)")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.ImagePullPolicy == "" {
		cfg.ImagePullPolicy = string(corev1.PullIfNotPresent)
	}
	if cfg.RequestRatio <= 0 || cfg.RequestRatio > 1 {
		cfg.RequestRatio = DefaultRequestRatio
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = time.Hour
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = 24 * time.Hour
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rc, err := RestConfig(cfg.Kubeconfig, cfg.Context)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	rc = rest.CopyConfig(rc)
	rc.Timeout = cfg.RequestTimeout
	rc.UserAgent = "toolhost"
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &Provider{cfg: cfg, log: cfg.Logger.With("provider", "kubernetes"), rest: rc,
		dyn: dyn.Resource(SandboxResource), claims: dyn.Resource(ClaimResource), templates: dyn.Resource(TemplateResource),
		pools: dyn.Resource(WarmPoolResource), core: core, server: rc.Host, warm: map[string]warmPool{}}, nil
}

// MaxLifetime is the longest a sandbox may live (sandbox.LifetimeBound).
func (p *Provider) MaxLifetime() time.Duration { return p.cfg.MaxLifetime }

// Namespace is where the provider makes its Sandboxes.
func (p *Provider) Namespace() string { return p.cfg.Namespace }

// check validates options and returns the sandbox's lifetime.
func (p *Provider) check(opts sandbox.CreateOptions) (time.Duration, error) {
	switch opts.Network {
	case sandbox.NetworkHost:
	case "", sandbox.NetworkNone:
		if !p.cfg.NetworkPolicy {
			return 0, fmt.Errorf("network %q: a pod has the cluster's network unless a NetworkPolicy takes it away; apply deploy/kubernetes-sandboxes/networkpolicy.yaml in namespace %s (with a network plugin that enforces it) and set kubernetes.network_policy: true, or use sandbox.network: host: %w",
				sandbox.NetworkNone, p.cfg.Namespace, sandbox.ErrUnsupported)
		}
	case sandbox.NetworkEgress:
		if !p.cfg.NetworkPolicy {
			return 0, fmt.Errorf("network %q: a pod has the cluster's network, and could go around the egress gateway, unless a NetworkPolicy takes it away; apply deploy/kubernetes-sandboxes/networkpolicy-egress.yaml in namespace %s (with a network plugin that enforces it) and set kubernetes.network_policy: true, or use sandbox.network: host: %w",
				sandbox.NetworkEgress, p.cfg.Namespace, sandbox.ErrUnsupported)
		}
		if opts.Egress == nil || opts.Egress.Gateway == nil {
			return 0, fmt.Errorf("network %q needs the host's egress gateway (CreateOptions.Egress)", sandbox.NetworkEgress)
		}
		if p.cfg.EgressListen == "" {
			return 0, fmt.Errorf("network %q: set kubernetes.egress_listen (and kubernetes.egress_address) so that sandbox pods reach this host's egress gateway (docs/KUBERNETES.md#network): %w",
				sandbox.NetworkEgress, sandbox.ErrUnsupported)
		}
	default:
		return 0, fmt.Errorf("unknown network mode %q (want %q, %q or %q)", opts.Network, sandbox.NetworkNone, sandbox.NetworkEgress, sandbox.NetworkHost)
	}
	if opts.Workspace != "" {
		// A pod elsewhere cannot mount a directory of this host, and silently giving it an
		// empty workspace instead would lose the caller's files.
		return 0, fmt.Errorf("a host directory as the workspace: a Kubernetes sandbox cannot mount one: %w", sandbox.ErrUnsupported)
	}
	for k := range opts.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || k == envToken || k == envPoolToken || k == envPod || k == envRelay {
			return 0, fmt.Errorf("invalid environment variable name %q", k)
		}
	}
	for k, v := range opts.Labels {
		if k == "" || len(k) > 256 || len(v) > 1024 || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return 0, fmt.Errorf("invalid label %q (a name of 1 to 256 bytes and a value of at most 1024, in UTF-8)", k)
		}
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = p.cfg.DefaultTimeout
	}
	if timeout < 0 {
		return 0, fmt.Errorf("timeout %s is negative", timeout)
	}
	if timeout > p.cfg.MaxLifetime {
		return 0, fmt.Errorf("timeout %s is past the maximum lifetime of %s (kubernetes provider: session.max_lifetime)", timeout, p.cfg.MaxLifetime)
	}
	return timeout, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// podSpec is the pod template's spec of a new sandbox; auth are the variables that give
// its agent a token (envToken, or a warm pool's: poolAuth); relay, for a sandbox with
// network egress, is the egress relay's address (its agent's way out, and every command's
// proxy variables: egress.go).
func (p *Provider) podSpec(auth []corev1.EnvVar, env map[string]string, relay string) corev1.PodSpec {
	uid, no, yes := int64(1000), false, true
	grace := int64(5)
	vars := append([]corev1.EnvVar{{Name: "HOME", Value: sandbox.WorkspaceRoot}}, auth...)
	if relay != "" {
		vars = append(vars, corev1.EnvVar{Name: envRelay, Value: relay})
		proxy := sandbox.EgressEnv()
		for _, k := range slices.Sorted(maps.Keys(proxy)) {
			if _, set := env[k]; !set {
				vars = append(vars, corev1.EnvVar{Name: k, Value: proxy[k]})
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		vars = append(vars, corev1.EnvVar{Name: k, Value: env[k]})
	}
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	ratio := p.cfg.RequestRatio
	if m := p.cfg.Limits.MemoryBytes; m > 0 {
		res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(m, resource.BinarySI)
		res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(max(int64(float64(m)*ratio), 16<<20), resource.BinarySI)
	}
	if c := p.cfg.Limits.CPUs; c > 0 {
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(c*1000), resource.DecimalSI)
		res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(int64(c*1000*ratio), 10), resource.DecimalSI)
	}
	var wsLimit *resource.Quantity
	if d := p.cfg.Limits.DiskBytes; d > 0 {
		q := resource.NewQuantity(d, resource.BinarySI)
		res.Limits[corev1.ResourceEphemeralStorage] = *q
		wsLimit = q
	}
	var tols []corev1.Toleration
	for _, t := range p.cfg.Tolerations {
		tols = append(tols, corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
	}
	spec := corev1.PodSpec{
		// The sandbox gets no credentials of the cluster, no service links, and the
		// agent is its first process (it reaps what the sandbox leaves).
		AutomountServiceAccountToken:  &no,
		EnableServiceLinks:            &no,
		ShareProcessNamespace:         &no,
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: &grace,
		NodeSelector:                  maps.Clone(p.cfg.NodeSelector),
		Tolerations:                   tols,
		SecurityContext: &corev1.PodSecurityContext{
			RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name:            containerName,
			Image:           p.cfg.Image,
			ImagePullPolicy: corev1.PullPolicy(p.cfg.ImagePullPolicy),
			Command:         []string{"/usr/local/bin/toolhost-agent", "--listen", "0.0.0.0:" + strconv.Itoa(AgentPort), "--workspace", sandbox.WorkspaceRoot},
			WorkingDir:      sandbox.WorkspaceRoot,
			Env:             vars,
			Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: AgentPort, Protocol: corev1.ProtocolTCP}},
			Resources:       res,
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: envd.PathHealth, Port: intstr.FromInt32(AgentPort)}},
				PeriodSeconds: 1, FailureThreshold: 3,
			},
			SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: &no,
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "workspace", MountPath: sandbox.WorkspaceRoot},
				{Name: "tmp", MountPath: "/tmp"},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: wsLimit}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
	if p.cfg.RuntimeClass != "" {
		rc := p.cfg.RuntimeClass
		spec.RuntimeClassName = &rc
	}
	return spec
}

// labelsFor are the Kubernetes labels of a new sandbox: the configuration's, the
// provider's, and those of the session's labels that Kubernetes accepts as they are.
func (p *Provider) labelsFor(opts sandbox.CreateOptions, network string) map[string]string {
	l := maps.Clone(p.cfg.Labels)
	if l == nil {
		l = map[string]string{}
	}
	for k, v := range opts.Labels {
		name := labelPrefix + k
		if len(validation.IsQualifiedName(name)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			l[name] = v
		}
	}
	l[LabelManagedBy] = managedBy
	l[LabelSandbox] = "true"
	l[LabelNetwork] = network
	return l
}

// Create makes a Sandbox and returns once its agent answers, within ReadyTimeout.
func (p *Provider) Create(ctx context.Context, opts sandbox.CreateOptions) (sandbox.Sandbox, error) {
	timeout, err := p.check(opts)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes sandbox: %w", err)
	}
	network := opts.Network
	if network == "" {
		network = sandbox.NetworkNone
	}
	if p.cfg.Pool > 0 {
		return p.createClaimed(ctx, opts, network, timeout)
	}
	began := time.Now()
	name := "toolhost-" + randomHex(6)
	token := randomHex(32)
	labels := p.labelsFor(opts, network)
	all, _ := json.Marshal(opts.Labels)
	if opts.Labels == nil {
		all = []byte("{}")
	}
	link, err := p.openEgress(opts, name, token)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes sandbox: %w", err)
	}
	spec := p.podSpec([]corev1.EnvVar{{Name: envToken, Value: token}}, link.env(opts.Env), link.addr())
	podSpec, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&spec)
	if err != nil {
		link.close()
		return nil, fmt.Errorf("create Kubernetes sandbox: %w", err)
	}
	// A sandbox's life counts from when it is ready: the end it is created with leaves
	// room for the pod to start (ReadyTimeout), and is moved to the real one once the
	// agent answers. A host that dies meanwhile leaves it that much longer at most.
	end := endAfter(timeout + p.cfg.ReadyTimeout)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": SandboxResource.GroupVersion().String(),
		"kind":       "Sandbox",
		"metadata": map[string]any{
			"name":        name,
			"namespace":   p.cfg.Namespace,
			"labels":      toAny(labels),
			"annotations": map[string]any{annotationLabels: string(all)},
		},
		"spec": map[string]any{
			"podTemplate": map[string]any{
				"metadata": map[string]any{"labels": toAny(labels)},
				"spec":     podSpec,
			},
			"shutdownTime":   end.UTC().Format(time.RFC3339),
			"shutdownPolicy": "Delete",
		},
	}}
	cctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	created, err := p.dyn.Namespace(p.cfg.Namespace).Create(cctx, obj, metav1.CreateOptions{FieldManager: managedBy})
	cancel()
	if err != nil {
		link.close()
		return nil, fmt.Errorf("create Kubernetes sandbox in namespace %s: %w", p.cfg.Namespace, p.explain(err))
	}
	startedAt := created.GetCreationTimestamp().Time
	sb, err := p.waitReady(ctx, name, token, began)
	if err == nil {
		if err = link.giveTrust(ctx, sb, p.cfg.RequestTimeout); err != nil {
			sb.detach()
		}
	}
	if err != nil {
		link.close()
		p.deleteQuietly(context.WithoutCancel(ctx), name, false, "could not be set up")
		return nil, fmt.Errorf("create Kubernetes sandbox %s: %w", name, err)
	}
	sb.egress = link
	end = endAfter(timeout)
	if err := p.patchShutdown(ctx, name, false, end); err != nil {
		p.deleteQuietly(context.WithoutCancel(ctx), name, false, "could not be given its end time")
		return nil, fmt.Errorf("create Kubernetes sandbox %s: setting its end time: %w", name, err)
	}
	sb.start(startedAt, end)
	p.log.Info("Kubernetes sandbox created", "sandbox", name, "namespace", p.cfg.Namespace, "pod_ip", sb.podIP,
		"ends", end.UTC().Format(time.RFC3339), "took", time.Since(began))
	return sb, nil
}

// endAfter is the end time of a sandbox that lives d from now, in the whole seconds a
// Sandbox's spec.shutdownTime holds (rounded up: never earlier than asked).
func endAfter(d time.Duration) time.Time {
	return time.Now().Add(d).Truncate(time.Second).Add(time.Second)
}

// toAny is a string map as unstructured content.
func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// explain turns the API server's answers into errors written for whoever runs the
// cluster: what failed and what to do. What the cluster cannot do now (unreachable, the
// CRD or the permission missing) wraps sandbox.ErrUnavailable, so a chain goes on.
func (p *Provider) explain(err error) error {
	return p.explainFor(err, "Sandbox resource (agents.x-k8s.io/v1alpha1): install agent-sandbox")
}

// explainFor is explain for a request about a resource: missing says which is missing and
// what to do.
func (p *Provider) explainFor(err error, missing string) error {
	switch {
	case apierrors.IsNotFound(err):
		var st apierrors.APIStatus
		// A named object that is not there is the caller's to handle (ErrGone); a 404 for
		// no name is the resource itself missing.
		if errors.As(err, &st) && (st.Status().Details == nil || st.Status().Details.Name == "") {
			return fmt.Errorf("%w: the cluster at %s has no %s (docs/KUBERNETES.md): %w", sandbox.ErrUnavailable, p.server, missing, err)
		}
		return err
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: the cluster refused the provider's user: bind it the Role of deploy/kubernetes-sandboxes/role.yaml in namespace %s: %w", sandbox.ErrUnavailable, p.cfg.Namespace, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: the cluster at %s did not accept the credentials of the kubeconfig: %w", sandbox.ErrUnavailable, p.server, err)
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err):
		return fmt.Errorf("%w: the Kubernetes API server at %s: %w", sandbox.ErrUnavailable, p.server, err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &oe) || errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: cannot reach the Kubernetes API server at %s: %w", sandbox.ErrUnavailable, p.server, err)
	}
	return err
}

// podFailure says why a pod will not run its agent, or "" while it may still.
func podFailure(pod *corev1.Pod) string {
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return fmt.Sprintf("the pod ended (%s: %s %s)", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName":
				return fmt.Sprintf("the agent image %s cannot be pulled (%s: %s): check kubernetes.image and the node's access to its registry", cs.Image, w.Reason, w.Message)
			case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
				return fmt.Sprintf("the agent's container cannot run (%s: %s)", w.Reason, w.Message)
			}
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("the agent's container ended (%s, exit %d: %s)", t.Reason, t.ExitCode, t.Message)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "" // may fit later (a node scaling up); the bound decides
		}
	}
	return ""
}

// waitReady waits, within ReadyTimeout, for the Sandbox's pod to be ready and its agent to
// answer; it fails early when the pod cannot get there (an image that cannot be pulled).
func (p *Provider) waitReady(ctx context.Context, name, token string, began time.Time) (*Sandbox, error) {
	return p.waitPod(ctx, began, "no pod yet: is the agent-sandbox controller running in the cluster?",
		func(context.Context) (string, string, error) { return name, "", nil },
		func(ctx context.Context, _, ip string) (*Sandbox, error) { return p.open(ctx, name, token, ip) })
}

// waitPod waits, within ReadyTimeout, for the pod find names (once it names one; else it
// says what it waits for) to be ready, then for connect to reach its agent.
func (p *Provider) waitPod(ctx context.Context, began time.Time, last string,
	find func(context.Context) (pod, waiting string, err error),
	connect func(ctx context.Context, pod, ip string) (*Sandbox, error)) (*Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		name, waiting, err := find(ctx)
		var pod *corev1.Pod
		if err == nil && name != "" {
			pod, err = p.core.Pods(p.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		} else if err == nil {
			last = waiting
		}
		switch {
		case err == nil && pod != nil:
			if why := podFailure(pod); why != "" {
				return nil, fmt.Errorf("%w: %s", sandbox.ErrUnavailable, why)
			}
			last = podState(pod)
			if podReady(pod) && pod.Status.PodIP != "" {
				sb, err := connect(ctx, name, pod.Status.PodIP)
				if err == nil {
					return sb, nil
				}
				last = fmt.Sprintf("the pod is ready but its agent at %s does not answer: %v", pod.Status.PodIP, err)
			}
		case err == nil, apierrors.IsNotFound(err):
		case ctx.Err() == nil:
			if e := p.explain(err); errors.Is(e, sandbox.ErrUnavailable) {
				return nil, e
			}
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("%w: the sandbox was not ready within %s (kubernetes.ready_timeout): %s", sandbox.ErrUnavailable, time.Since(began).Round(time.Second), last)
			}
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		// Every 100 ms while a pod may be about to answer (a warm pool's is ready as soon
		// as its claim is bound), then backing off to a second.
		if time.Since(began) > 2*time.Second {
			wait = min(wait*2, time.Second)
		}
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podState(pod *corev1.Pod) string {
	s := "the pod is " + string(pod.Status.Phase)
	for _, c := range pod.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf("; %s: %s", c.Type, c.Message)
		}
	}
	return s
}

// agentClient is a client of the agent at ip that carries token.
func agentClient(ip, token string) (*client.Client, error) {
	return client.New(client.Config{
		BaseURL: "http://" + net.JoinHostPort(ip, strconv.Itoa(AgentPort)),
		Header:  http.Header{envd.HeaderAccessToken: {token}},
	})
}

// open makes the handle of a sandbox whose agent is at ip, once the agent answers.
func (p *Provider) open(ctx context.Context, name, token, ip string) (*Sandbox, error) {
	c, err := agentClient(ip, token)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Health(hctx); err != nil {
		c.Close()
		return nil, err
	}
	return newSandbox(p, name, ip, c), nil
}

// deleteQuietly deletes a Sandbox (or a SandboxClaim: claimed), logging a failure.
func (p *Provider) deleteQuietly(ctx context.Context, name string, claimed bool, why string) {
	if err := p.delete(ctx, name, claimed); err != nil {
		p.log.Warn("delete a Kubernetes sandbox that "+why, "sandbox", name, "err", err)
	}
}

// delete deletes a Sandbox (its pod and service go with it), or with claimed the
// SandboxClaim (its Sandbox, pod and service go with it); one already gone is not an error.
func (p *Provider) delete(ctx context.Context, name string, claimed bool) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	bg := metav1.DeletePropagationBackground
	res, kind := p.dyn, "Sandbox"
	if claimed {
		res, kind = p.claims, "SandboxClaim"
	}
	err := res.Namespace(p.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s/%s: %w", kind, p.cfg.Namespace, name, p.explain(err))
	}
	return nil
}

// patchShutdown moves a Sandbox's spec.shutdownTime, or with claimed a SandboxClaim's
// spec.lifecycle.shutdownTime.
func (p *Provider) patchShutdown(ctx context.Context, name string, claimed bool, end time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	at := end.UTC().Format(time.RFC3339)
	res, spec := p.dyn, map[string]any{"shutdownTime": at}
	if claimed {
		res, spec = p.claims, map[string]any{"lifecycle": map[string]any{"shutdownTime": at, "shutdownPolicy": "Delete"}}
	}
	patch, _ := json.Marshal(map[string]any{"spec": spec})
	_, err := res.Namespace(p.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managedBy})
	if err != nil {
		return p.explain(err)
	}
	return nil
}
