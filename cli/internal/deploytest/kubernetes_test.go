package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/toolhost/toolhost"
	"github.com/toolhost/toolhost/cli/internal/config"
	"github.com/toolhost/toolhost/internal/mcpserve"
	"github.com/toolhost/toolhost/internal/testenv"
)

// The repository's root, from this package's directory.
var root = filepath.Join("..", "..", "..")

func manifestsDir() string { return filepath.Join(root, "deploy", "kubernetes") }

// commitBound is how long toolhost serve gives committing and closing every session when
// it stops (cmd/toolhost's shutdownGrace): part of what the grace period must cover.
const commitBound = 5 * time.Minute

// apiKind is an API resource the manifests may use, as a cluster of Kubernetes 1.30 or
// later serves it: the stand-in API server's discovery answers with these, so a manifest
// of a kind or version not listed (policy/v1beta1, gone since 1.25) fails to apply.
type apiKind struct {
	group, version, kind, resource string
	new                            func() any
}

var apiKinds = []apiKind{
	{"", "v1", "ConfigMap", "configmaps", func() any { return new(corev1.ConfigMap) }},
	{"", "v1", "Service", "services", func() any { return new(corev1.Service) }},
	{"", "v1", "ServiceAccount", "serviceaccounts", func() any { return new(corev1.ServiceAccount) }},
	{"apps", "v1", "Deployment", "deployments", func() any { return new(appsv1.Deployment) }},
	{"policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", func() any { return new(policyv1.PodDisruptionBudget) }},
}

func (k apiKind) groupVersion() string {
	if k.group == "" {
		return k.version
	}
	return k.group + "/" + k.version
}

// object is one manifest, decoded.
type object struct {
	file  string
	kind  apiKind
	name  string
	value any
}

// decodeStrict decodes one manifest into its Kubernetes type, refusing unknown and
// duplicate fields: the schema check kubectl makes only with a real API server's OpenAPI.
// It reads YAML as kubectl does (sigs.k8s.io/yaml: YAML 1.1, so 0440 is octal).
func decodeStrict(file string, data []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", file, err)
	}
	for _, k := range apiKinds {
		if k.kind != head.Kind || k.groupVersion() != head.APIVersion {
			continue
		}
		v := k.new()
		if err := yaml.UnmarshalStrict(data, v); err != nil {
			return object{}, fmt.Errorf("%s: %s %s: %w", file, head.Kind, head.Metadata.Name, err)
		}
		return object{file: file, kind: k, name: head.Metadata.Name, value: v}, nil
	}
	return object{}, fmt.Errorf("%s: %s %s is not a kind this test knows (add it to apiKinds)", file, head.APIVersion, head.Kind)
}

// loadManifests decodes every file kubectl apply -f reads in the directory (.yaml, .yml,
// .json), one object per file.
func loadManifests(t *testing.T) []object {
	t.Helper()
	entries, err := os.ReadDir(manifestsDir())
	if err != nil {
		t.Fatal(err)
	}
	var objs []object
	for _, e := range entries {
		if e.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(e.Name())) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(manifestsDir(), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "---") {
				t.Fatalf("%s: several documents in one file; keep one object per file", e.Name())
			}
		}
		o, err := decodeStrict(e.Name(), data)
		if err != nil {
			t.Fatal(err)
		}
		if o.name == "" {
			t.Fatalf("%s: %s without metadata.name", e.Name(), o.kind.kind)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("no manifests in %s", manifestsDir())
	}
	return objs
}

// The strict decoder refuses a misspelled field (what the manifests' check rests on), and
// reads 0440 as octal, as kubectl does.
func TestDecodeStrict(t *testing.T) {
	bad := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: x\n          readinesProbe: {}\n"
	if _, err := decodeStrict("bad.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "readinesProbe") {
		t.Fatalf("a Deployment with readinesProbe decoded: %v", err)
	}
	mode := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      volumes:\n        - name: s\n          secret: {secretName: s, defaultMode: 0440}\n"
	o, err := decodeStrict("mode.yaml", []byte(mode))
	if err != nil {
		t.Fatal(err)
	}
	if m := o.value.(*appsv1.Deployment).Spec.Template.Spec.Volumes[0].Secret.DefaultMode; m == nil || *m != 0o440 {
		t.Fatalf("defaultMode: 0440 decoded as %v, want %d", m, 0o440)
	}
}

// fakeAPI is a stand-in Kubernetes API server on loopback: kubectl apply --dry-run=client
// needs one for discovery (which kinds exist, at which paths) and asks it whether each
// object exists, which it never does. It serves no OpenAPI schema (kubectl then goes on
// without one, as --validate=false tells it to) and answers nothing else: a client dry run
// writes nothing, which it checks (any other method is refused and recorded).
type fakeAPI struct {
	srv *httptest.Server

	mu    sync.Mutex
	gets  []string // objects asked about: resource/name
	other []string // requests it had no answer for
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{}
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	groups := map[string][]apiKind{} // group/version (v1 for the core group) -> kinds
	for _, k := range apiKinds {
		groups[k.groupVersion()] = append(groups[k.groupVersion()], k)
	}
	resourceList := func(gv string) any {
		var rs []any
		for _, k := range groups[gv] {
			rs = append(rs, map[string]any{
				"name": k.resource, "singularName": strings.ToLower(k.kind), "namespaced": true, "kind": k.kind,
				"verbs": []string{"create", "delete", "get", "list", "patch", "update", "watch"},
			})
		}
		return map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs}
	}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			f.record(&f.other, r.Method+" "+r.URL.Path)
			http.Error(w, "a client dry run writes nothing", http.StatusMethodNotAllowed)
			return
		}
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch {
		case r.URL.Path == "/version":
			writeJSON(w, 200, map[string]string{"major": "1", "minor": "32", "gitVersion": "v1.32.0"})
		case r.URL.Path == "/api":
			writeJSON(w, 200, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
				"serverAddressByClientCIDRs": []any{map[string]string{"clientCIDR": "0.0.0.0/0", "serverAddress": r.Host}}})
		case r.URL.Path == "/apis":
			var gs []any
			for gv := range groups {
				if g, v, ok := strings.Cut(gv, "/"); ok {
					ver := map[string]string{"groupVersion": gv, "version": v}
					gs = append(gs, map[string]any{"name": g, "versions": []any{ver}, "preferredVersion": ver})
				}
			}
			writeJSON(w, 200, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
		case len(parts) == 2 && parts[0] == "api" && groups[parts[1]] != nil:
			writeJSON(w, 200, resourceList(parts[1]))
		case len(parts) == 3 && parts[0] == "apis" && groups[parts[1]+"/"+parts[2]] != nil:
			writeJSON(w, 200, resourceList(parts[1]+"/"+parts[2]))
		case strings.HasPrefix(r.URL.Path, "/openapi/") || r.URL.Path == "/swagger-2.0.0.pb-v1":
			// kubectl 1.20 asks for the schema even with --validate=false, and goes on
			// without one.
			http.NotFound(w, r)
		case len(parts) >= 5 && parts[len(parts)-4] == "namespaces":
			// GET .../namespaces/NS/RESOURCE/NAME: no such object (yet).
			resource, name := parts[len(parts)-2], parts[len(parts)-1]
			f.record(&f.gets, resource+"/"+name)
			writeJSON(w, 404, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
				"message": resource + " " + strconv.Quote(name) + " not found", "reason": "NotFound",
				"details": map[string]string{"name": name, "kind": resource}, "code": 404})
		default:
			f.record(&f.other, "GET "+r.URL.Path)
			writeJSON(w, 404, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) record(list *[]string, s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*list = append(*list, s)
}

// TestKubectlApplyDryRun applies deploy/kubernetes/ as an operator would, with
// --dry-run=client: kubectl parses every file, maps each kind to a resource the cluster
// serves and asks whether the object exists. (kubectl's schema check needs a real API
// server's OpenAPI, which nothing here serves: decodeStrict makes it.)
func TestKubectlApplyDryRun(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	testenv.Require(t, "kubectl (make test installs it: Debian's kubernetes-client)", err)
	objs := loadManifests(t)
	api := newFakeAPI(t)

	home := t.TempDir()
	kubeconfig := filepath.Join(home, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster: {server: %q}
users:
- name: nobody
  user: {}
contexts:
- name: stand-in
  context: {cluster: stand-in, user: nobody, namespace: default}
current-context: stand-in
`, api.srv.URL)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "apply", "--dry-run=client", "--validate=false",
		"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(home, "cache"), "-f", manifestsDir())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=client -f deploy/kubernetes: %v\n%s", err, out)
	}

	var want []string
	for _, o := range objs {
		name := strings.ToLower(o.kind.kind)
		if o.kind.group != "" {
			name += "." + o.kind.group
		}
		want = append(want, name+"/"+o.name+" created (dry run)")
		if !slices.Contains(api.gets, o.kind.resource+"/"+o.name) {
			t.Errorf("kubectl never asked about %s %s", o.kind.kind, o.name)
		}
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("kubectl said:\n%s\nwant (in any order):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(api.other) > 0 {
		t.Errorf("kubectl made requests the stand-in API has no answer for: %v", api.other)
	}
}

// deployment is the manifests' objects, by role.
type deployment struct {
	dep     *appsv1.Deployment
	main    corev1.Container
	cm      *corev1.ConfigMap
	svc     *corev1.Service
	pdb     *policyv1.PodDisruptionBudget
	sa      *corev1.ServiceAccount
	volumes map[string]corev1.Volume
}

func findDeployment(t *testing.T) deployment {
	t.Helper()
	var d deployment
	count := map[string]int{}
	for _, o := range loadManifests(t) {
		count[o.kind.kind]++
		switch v := o.value.(type) {
		case *appsv1.Deployment:
			d.dep = v
		case *corev1.ConfigMap:
			d.cm = v
		case *corev1.Service:
			d.svc = v
		case *policyv1.PodDisruptionBudget:
			d.pdb = v
		case *corev1.ServiceAccount:
			d.sa = v
		}
	}
	for _, k := range apiKinds {
		if count[k.kind] != 1 {
			t.Fatalf("deploy/kubernetes has %d objects of kind %s, want 1", count[k.kind], k.kind)
		}
	}
	spec := d.dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("the Deployment has %d containers, want 1 (toolhost serve)", len(spec.Containers))
	}
	d.main = spec.Containers[0]
	d.volumes = map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		d.volumes[v.Name] = v
	}
	return d
}

// mountOf is the mount of c holding path, and its volume.
func (d deployment) mountOf(t *testing.T, c corev1.Container, path string) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	best := corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	if best.Name == "" {
		t.Fatalf("container %s mounts nothing at %s (its root filesystem is read-only)", c.Name, path)
	}
	v, ok := d.volumes[best.Name]
	if !ok {
		t.Fatalf("container %s mounts volume %s, which the pod does not have", c.Name, best.Name)
	}
	return best, v
}

// portOf resolves a probe's or Service's port (a number or a name) to c's container port.
func portOf(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	for _, cp := range c.Ports {
		if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %s", c.Name, p.String())
	return 0
}

// standInSecrets are the values the test gives the Secret's keys.
var standInSecrets = map[string]string{
	"tokens":       "0123456789abcdef0123456789abcdef shop\n",
	"fleet-secret": "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\n",
	"e2b-api-key":  "e2b_0123456789abcdef",
}

// environ is the main container's environment as the kubelet gives it: $(VAR) of a
// variable defined before it expanded, the pod's IP, the Secret's stand-in values
// (optional keys absent).
func environ(t *testing.T, c corev1.Container, podIP string) []string {
	t.Helper()
	vals := map[string]string{}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			v = expand(v, vals)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = podIP
		case e.ValueFrom.SecretKeyRef != nil:
			s, ok := standInSecrets[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				if e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional {
					continue
				}
				t.Fatalf("%s comes from Secret key %s, which docs/FLEET.md's Secret does not have", e.Name, e.ValueFrom.SecretKeyRef.Key)
			}
			v = s
		default:
			t.Fatalf("%s: a value source this test does not know: %+v", e.Name, e.ValueFrom)
		}
		vals[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env
}

// expand is the kubelet's $(VAR) expansion: a variable defined before; $$ is $.
func expand(s string, vals map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i:], ')'); end > 0 {
				if v, ok := vals[s[i+2:i+end]]; ok {
					b.WriteString(v)
					i += end
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func envValue(env []string, name string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// loadConfig loads the ConfigMap's toolhost.yaml with the container's environment, through
// the CLI's own loader (what toolhost serve does at its start: unknown keys and
// TOOLHOST_ variables refused, Validate).
func loadConfig(t *testing.T, d deployment, podIP string) *config.Loaded {
	t.Helper()
	env := environ(t, d.main, podIP)
	cfgPath := envValue(env, config.EnvConfigFile)
	if cfgPath == "" {
		t.Fatalf("the container does not set %s", config.EnvConfigFile)
	}
	m, vol := d.mountOf(t, d.main, cfgPath)
	if vol.ConfigMap == nil || vol.ConfigMap.Name != d.cm.Name || len(vol.ConfigMap.Items) > 0 {
		t.Fatalf("%s=%s is on volume %s, not ConfigMap %s's keys", config.EnvConfigFile, cfgPath, m.Name, d.cm.Name)
	}
	data, ok := d.cm.Data[strings.TrimPrefix(cfgPath, strings.TrimSuffix(m.MountPath, "/")+"/")]
	if !ok {
		t.Fatalf("%s=%s names no key of ConfigMap %s", config.EnvConfigFile, cfgPath, d.cm.Name)
	}
	tmp := filepath.Join(t.TempDir(), "toolhost.yaml")
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	loadEnv := slices.Clone(env)
	for i, kv := range loadEnv {
		if strings.HasPrefix(kv, config.EnvConfigFile+"=") {
			loadEnv[i] = config.EnvConfigFile + "=" + tmp
		}
	}
	l, err := config.Load(config.Sources{Environ: loadEnv, ConfigHome: t.TempDir()})
	if err != nil {
		t.Fatalf("the ConfigMap's toolhost.yaml with the Deployment's environment: %v", err)
	}
	return l
}

// TestDeploymentAgreesWithConfig loads the ConfigMap's toolhost.yaml as a replica would
// and checks the Deployment around it: the fleet's settings, the ports and probes, where
// the secret files are and that toolhost accepts them as the init container leaves them,
// the security context and the grace period.
func TestDeploymentAgreesWithConfig(t *testing.T) {
	d := findDeployment(t)
	// A first load finds the pod CIDR; the pod's IP is an address in it.
	first := loadConfig(t, d, "192.0.2.10")
	if len(first.Serve.Fleet.Peers) == 0 {
		t.Fatal("serve.fleet.peers is empty: the replicas' pod CIDR must be listed")
	}
	podIP := netip.MustParsePrefix(first.Serve.Fleet.Peers[0]).Masked().Addr().Next().Next()
	cfg := loadConfig(t, d, podIP.String())

	// The fleet, as docs/FLEET.md describes it.
	if cfg.Store.Kind != "s3" {
		t.Errorf("store.kind is %q, want s3: the replicas share one store", cfg.Store.Kind)
	}
	if p := toolhost.ProviderNamesOf(cfg.Sandbox.Provider); !slices.Equal(p, []string{"e2b"}) {
		t.Errorf("sandbox.provider is %q, want e2b", cfg.Sandbox.Provider)
	}
	if key, _ := cfg.Get("e2b.api_key"); key != toolhost.Secret(standInSecrets["e2b-api-key"]) {
		t.Error("e2b.api_key is not the Secret's e2b-api-key")
	}
	if cfg.Serve.Drain != toolhost.DrainHandoff {
		t.Errorf("serve.drain is %q, want %s", cfg.Serve.Drain, toolhost.DrainHandoff)
	}
	_, listenPort, err := net.SplitHostPort(cfg.Serve.Listen)
	if err != nil {
		t.Fatalf("serve.listen %q: %v", cfg.Serve.Listen, err)
	}
	if want := "http://" + net.JoinHostPort(podIP.String(), listenPort); cfg.Serve.Fleet.Advertise != want {
		t.Errorf("serve.fleet.advertise is %q, want the pod's address and serve.listen's port, %s", cfg.Serve.Fleet.Advertise, want)
	}
	inPeers := false
	for _, p := range cfg.Serve.Fleet.Peers {
		inPeers = inPeers || netip.MustParsePrefix(p).Contains(podIP)
	}
	if !inPeers {
		t.Errorf("the advertised address %s is in none of serve.fleet.peers %v", podIP, cfg.Serve.Fleet.Peers)
	}

	if !slices.Equal(d.main.Args, []string{"serve"}) || len(d.main.Command) != 1 || filepath.Base(d.main.Command[0]) != "toolhost" {
		t.Errorf("the container runs %q %q, not toolhost serve", d.main.Command, d.main.Args)
	}

	// Ports and probes.
	port, _ := strconv.Atoi(listenPort)
	if got := portOf(t, d.main, intstr.FromString("http")); got != int32(port) {
		t.Errorf("containerPort http is %d, serve.listen's port %d", got, port)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readinessProbe", d.main.ReadinessProbe, "/readyz"}, {"livenessProbe", d.main.LivenessProbe, "/healthz"}, {"startupProbe", d.main.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: missing, or not an HTTP GET", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || portOf(t, d.main, p.probe.HTTPGet.Port) != int32(port) {
			t.Errorf("%s: GET %s on port %s, want %s on serve.listen's port %d", p.what, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path, port)
		}
	}
	if got := portOf(t, d.main, d.svc.Spec.Ports[0].TargetPort); got != int32(port) {
		t.Errorf("the Service sends to port %d, serve.listen's is %d", got, port)
	}

	// Labels, replicas, the budget.
	labels := d.dep.Spec.Template.Labels
	for what, sel := range map[string]map[string]string{
		"the Deployment's selector": d.dep.Spec.Selector.MatchLabels, "the Service's selector": d.svc.Spec.Selector,
		"the PodDisruptionBudget's selector": d.pdb.Spec.Selector.MatchLabels,
	} {
		if len(sel) == 0 {
			t.Errorf("%s is empty", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s %v does not select the pods (labels %v)", what, sel, labels)
			}
		}
	}
	if d.dep.Spec.Replicas == nil || *d.dep.Spec.Replicas != 3 {
		t.Errorf("replicas: %v, want 3", d.dep.Spec.Replicas)
	}
	if mu := d.pdb.Spec.MaxUnavailable; mu == nil || mu.String() != "1" {
		t.Errorf("the PodDisruptionBudget's maxUnavailable is %v, want 1", mu)
	}

	// The state on writable volumes (the root filesystem is read-only).
	for what, path := range map[string]string{"data_dir": cfg.DataDir, "the temp dir": "/tmp"} {
		if m, _ := d.mountOf(t, d.main, path); m.ReadOnly {
			t.Errorf("%s %s is on a read-only mount", what, path)
		}
	}

	checkSecretFiles(t, d, cfg)
	checkSecurity(t, d)

	// The grace period: the preStop sleep, then the handoff: the call in flight (at most
	// limits.exec_timeout_max), the commit and close.
	spec := d.dep.Spec.Template.Spec
	pre := d.main.Lifecycle
	if pre == nil || pre.PreStop == nil || pre.PreStop.Sleep == nil || pre.PreStop.Sleep.Seconds < 1 {
		t.Fatal("no preStop sleep: the balancers would still send requests to a pod that stopped taking them")
	}
	need := time.Duration(pre.PreStop.Sleep.Seconds)*time.Second + cfg.Limits.ExecTimeoutMax + commitBound
	grace := time.Duration(0)
	if spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	}
	if grace < need {
		t.Errorf("terminationGracePeriodSeconds is %s, less than preStop + limits.exec_timeout_max + the commit bound = %s", grace, need)
	}
}

// checkSecretFiles: toolhost reads serve.tokens_file and serve.fleet.secret_file from the
// in-memory volume the init container fills; the init container's script, run here on
// stand-ins for the Secret volume (0440, as the kubelet makes it with fsGroup), leaves
// files toolhost accepts.
func checkSecretFiles(t *testing.T, d deployment, cfg *config.Loaded) {
	spec := d.dep.Spec.Template.Spec
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1 (the secrets' copy)", len(spec.InitContainers))
	}
	initC := spec.InitContainers[0]
	if initC.Image != d.main.Image {
		t.Errorf("the init container's image %s is not toolhost's %s", initC.Image, d.main.Image)
	}
	files := map[string]string{"serve.tokens_file": cfg.Serve.TokensFile, "serve.fleet.secret_file": cfg.Serve.Fleet.SecretFile}
	var dstMount corev1.VolumeMount
	for key, path := range files {
		m, v := d.mountOf(t, d.main, path)
		if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory || !m.ReadOnly {
			t.Errorf("%s %s: on volume %s, want a read-only mount of an in-memory emptyDir", key, path, m.Name)
		}
		if dstMount.Name != "" && dstMount.Name != m.Name {
			t.Errorf("the secret files are on two volumes, %s and %s", dstMount.Name, m.Name)
		}
		dstMount = m
	}
	for _, m := range d.main.VolumeMounts {
		if v := d.volumes[m.Name]; v.Secret != nil {
			t.Errorf("the toolhost container mounts Secret volume %s, whose files are group-readable: toolhost refuses them", m.Name)
		}
	}

	// The init container's mounts, remapped to directories here.
	tmp := t.TempDir()
	remap := map[string]string{}
	var secretVol *corev1.SecretVolumeSource
	var srcDir string
	for _, m := range initC.VolumeMounts {
		v := d.volumes[m.Name]
		dir := filepath.Join(tmp, m.Name)
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		remap[m.MountPath] = dir
		if v.Secret != nil {
			secretVol, srcDir = v.Secret, dir
		}
	}
	if secretVol == nil {
		t.Fatal("the init container mounts no Secret volume")
	}
	dstDir, ok := remap[dstMount.MountPath]
	if !ok {
		t.Fatalf("the init container does not mount %s, the secret files' volume", dstMount.Name)
	}
	for _, it := range secretVol.Items {
		val, ok := standInSecrets[it.Key]
		if !ok {
			t.Fatalf("Secret volume item %s: a key docs/FLEET.md's Secret does not have", it.Key)
		}
		// What the kubelet writes: defaultMode, with group read added by fsGroup.
		mode := os.FileMode(0o644)
		if secretVol.DefaultMode != nil {
			mode = os.FileMode(*secretVol.DefaultMode)
		}
		if spec.SecurityContext != nil && spec.SecurityContext.FSGroup != nil {
			mode |= 0o440
		}
		p := filepath.Join(srcDir, it.Path)
		if err := os.WriteFile(p, []byte(val), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mcpserve.ReadTokensFile(filepath.Join(srcDir, "tokens")); err == nil {
		t.Error("toolhost read the tokens from the Secret volume as the kubelet leaves it: then the init container's copy is not needed")
	}
	script := strings.Join(append(slices.Clone(initC.Command), initC.Args...), "\x00")
	mounts := slices.Collect(func(yield func(string) bool) {
		for k := range remap {
			if !yield(k) {
				return
			}
		}
	})
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) }) // longest first
	for _, mp := range mounts {
		script = strings.ReplaceAll(script, mp, remap[mp])
	}
	argv := strings.Split(script, "\x00")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.HangBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the init container's command: %v\n%s", err, out)
	}
	for key, path := range files {
		local := filepath.Join(dstDir, strings.TrimPrefix(path, strings.TrimSuffix(dstMount.MountPath, "/")+"/"))
		st, err := os.Stat(local)
		if err != nil {
			t.Errorf("%s %s: the init container does not write it: %v", key, path, err)
			continue
		}
		if st.Mode().Perm() != 0o400 {
			t.Errorf("%s %s: mode %v, want 0400", key, path, st.Mode().Perm())
		}
	}
	toks, err := mcpserve.ReadTokensFile(filepath.Join(dstDir, filepath.Base(cfg.Serve.TokensFile)))
	if err != nil {
		t.Fatalf("toolhost refuses the tokens file the init container wrote: %v", err)
	}
	if err := mcpserve.CheckTokens(toks); err != nil || len(toks) != 1 || toks[0].Value != strings.Fields(standInSecrets["tokens"])[0] {
		t.Errorf("the tokens read: %+v, %v", toks, err)
	}
	// What toolhost serve checks next, before it listens.
	if err := mcpserve.CheckListen(cfg.Serve.Listen, len(toks)); err != nil {
		t.Error(err)
	}
	if err := mcpserve.CheckNetwork(cfg.Sandbox.Network, len(toks)); err != nil {
		t.Error(err)
	}
}

// checkSecurity: no privilege anywhere, no API token, non-root.
func checkSecurity(t *testing.T, d deployment) {
	spec := d.dep.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken ||
		d.sa.AutomountServiceAccountToken == nil || *d.sa.AutomountServiceAccountToken {
		t.Error("a service account token is mounted: toolhost talks to no Kubernetes API")
	}
	if spec.ServiceAccountName != d.sa.Name {
		t.Errorf("the pods run as service account %q, not %s", spec.ServiceAccountName, d.sa.Name)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Error("the pod may run as root: set runAsNonRoot and a runAsUser")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		t.Error("the pod shares a namespace of the node")
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("container %s: no securityContext", c.Name)
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("container %s: the root filesystem is writable", c.Name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			t.Errorf("container %s: capabilities are not all dropped", c.Name)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("container %s: privileged", c.Name)
		}
	}
}

// TestSecretKeysDocumented: every key of the Secret the manifests read is in
// docs/FLEET.md's command that makes it.
func TestSecretKeysDocumented(t *testing.T) {
	d := findDeployment(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "FLEET.md"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	spec := d.dep.Spec.Template.Spec
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			for _, it := range v.Secret.Items {
				keys[it.Key] = true
			}
		}
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				keys[e.ValueFrom.SecretKeyRef.Key] = true
			}
		}
	}
	for k := range keys {
		if !strings.Contains(string(doc), "--from-file="+k+"=") && !strings.Contains(string(doc), "--from-literal="+k+"=") {
			t.Errorf("Secret key %s: docs/FLEET.md's kubectl create secret does not make it", k)
		}
	}
}
