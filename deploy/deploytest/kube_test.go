package deploytest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/idem-dev/idem/idemproxy"
)

// objects are the Kubernetes objects of one set-up, decoded strictly.
type objects struct {
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	pdbs        []*policyv1.PodDisruptionBudget
}

// decodeObjects splits a YAML stream into documents and decodes each into
// its k8s.io/api type, strictly: a field the type does not have (a typo, a
// field at the wrong level) is an error, as kubectl apply's server-side
// field validation makes it.
func decodeObjects(t *testing.T, name string, stream []byte) *objects {
	t.Helper()
	var o objects
	for i, doc := range splitYAML(stream) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s, document %d: %v", name, i, err)
		}
		var err error
		decode := func(into any) { err = yaml.UnmarshalStrict(doc, into) }
		switch meta.APIVersion + " " + meta.Kind {
		case "v1 ConfigMap":
			v := new(corev1.ConfigMap)
			decode(v)
			o.configMaps = append(o.configMaps, v)
		case "v1 Secret":
			v := new(corev1.Secret)
			decode(v)
			o.secrets = append(o.secrets, v)
		case "v1 Service":
			v := new(corev1.Service)
			decode(v)
			o.services = append(o.services, v)
		case "apps/v1 Deployment":
			v := new(appsv1.Deployment)
			decode(v)
			o.deployments = append(o.deployments, v)
		case "policy/v1 PodDisruptionBudget":
			v := new(policyv1.PodDisruptionBudget)
			decode(v)
			o.pdbs = append(o.pdbs, v)
		default:
			t.Fatalf("%s, document %d: unexpected %s %s", name, i, meta.APIVersion, meta.Kind)
		}
		if err != nil {
			t.Errorf("%s, document %d (%s): %v", name, i, meta.Kind, err)
		}
	}
	return &o
}

// splitYAML splits a stream at its "---" lines, dropping documents that
// hold only comments.
func splitYAML(stream []byte) [][]byte {
	var docs [][]byte
	var cur []string
	flush := func() {
		for _, line := range cur {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				docs = append(docs, []byte(strings.Join(cur, "\n")))
				break
			}
		}
		cur = nil
	}
	for _, line := range strings.Split(string(stream), "\n") {
		if strings.HasPrefix(line, "---") {
			flush()
			continue
		}
		cur = append(cur, line)
	}
	flush()
	return docs
}

// setup says where idem runs in a set-up.
type setup struct {
	sidecar bool
}

// checkSetup checks the invariants every set-up keeps: idem's config
// parses and validates, its probes ask /livez and /readyz on the admin
// port, its secrets are files of a mounted Secret, its container runs
// unprivileged, it asks for resources, and the pod's grace period
// outlasts shutdown_timeout. It returns idem's config.
func checkSetup(t *testing.T, name string, o *objects, s setup) idemproxy.Config {
	t.Helper()
	if len(o.deployments) != 1 {
		t.Fatalf("%s: %d Deployments; want 1", name, len(o.deployments))
	}
	dep := o.deployments[0]
	pod := dep.Spec.Template.Spec
	var idem *corev1.Container
	for i, c := range pod.InitContainers {
		if c.Name == "idem" {
			idem = &pod.InitContainers[i]
		}
	}
	if s.sidecar {
		if idem == nil {
			t.Fatalf("%s: no init container idem", name)
		}
		if p := idem.RestartPolicy; p == nil || *p != corev1.ContainerRestartPolicyAlways {
			got := "unset"
			if p != nil {
				got = string(*p)
			}
			t.Errorf("%s: the idem init container's restartPolicy is %s; want Always (a native sidecar)", name, got)
		}
		if idem.StartupProbe == nil {
			t.Errorf("%s: the sidecar has no startup probe: the app may start before idem listens", name)
		}
		if len(pod.Containers) == 0 {
			t.Errorf("%s: no app container beside the sidecar", name)
		}
	} else {
		if idem != nil {
			t.Errorf("%s: idem is an init container in standalone mode", name)
		}
		for i, c := range pod.Containers {
			if c.Name == "idem" {
				idem = &pod.Containers[i]
			}
		}
		if idem == nil {
			t.Fatalf("%s: no container idem", name)
		}
	}

	// The config file idem reads: --config's path, in a mounted ConfigMap.
	i := slices.Index(idem.Args, "--config")
	if i < 0 || i+1 >= len(idem.Args) {
		t.Fatalf("%s: idem's args %q name no --config", name, idem.Args)
	}
	vol, file := mountedVolume(t, name, pod, idem, idem.Args[i+1])
	if vol.ConfigMap == nil {
		t.Fatalf("%s: --config %s is not in a ConfigMap volume", name, idem.Args[i+1])
	}
	var text string
	for _, cm := range o.configMaps {
		if cm.Name == vol.ConfigMap.Name {
			text = cm.Data[file]
		}
	}
	if text == "" {
		t.Fatalf("%s: no ConfigMap %s with %s", name, vol.ConfigMap.Name, file)
	}
	cfg, err := idemproxy.ParseConfig([]byte(text))
	if err != nil {
		t.Fatalf("%s: idem.yaml: %v", name, err)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: idem.yaml: %v", name, err)
	}

	// Secrets are files of a Secret volume: the *_file settings and
	// IDEM_STORE_FILE; none comes from an environment variable.
	secretFiles := map[string]string{"scope_secret_file": cfg.ScopeSecretFile, "admin_token_file": cfg.AdminTokenFile, "encryption_key_file": cfg.EncryptionKeyFile}
	for _, e := range idem.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("%s: %s comes from a Secret as a variable; mount it as a file", name, e.Name)
		}
		if e.Name == "IDEM_STORE_FILE" {
			secretFiles["IDEM_STORE_FILE"] = e.Value
		}
		if strings.HasPrefix(e.Name, "IDEM_") && e.Name != "IDEM_STORE_FILE" {
			t.Errorf("%s: %s holds a secret in a variable; use its *_file setting", name, e.Name)
		}
	}
	if cfg.ScopeSecretFile == "" || cfg.AdminTokenFile == "" {
		t.Errorf("%s: no scope_secret_file or admin_token_file", name)
	}
	for field, p := range secretFiles {
		if p == "" {
			continue
		}
		if v, _ := mountedVolume(t, name, pod, idem, p); v.Secret == nil {
			t.Errorf("%s: %s %s is not in a Secret volume", name, field, p)
		} else if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
			t.Errorf("%s: the Secret volume %s is readable by others (defaultMode %v)", name, v.Name, v.Secret.DefaultMode)
		}
	}
	if !strings.HasPrefix(cfg.Store, "sqlite://") || secretFiles["IDEM_STORE_FILE"] == "" {
		if secretFiles["IDEM_STORE_FILE"] == "" && strings.Contains(cfg.Store, "@") {
			t.Errorf("%s: the store URL %q with its password is in the ConfigMap", name, cfg.Store)
		}
	}

	// Probes: /livez and /readyz on the admin listener's port, which
	// listens beyond loopback so that the kubelet reaches it.
	_, adminPort, err := splitPort(cfg.Admin)
	if err != nil {
		t.Fatalf("%s: admin %q: %v", name, cfg.Admin, err)
	}
	if host, _, _ := splitPort(idemproxy.AdminAddr(cfg.Admin)); host == "127.0.0.1" || host == "localhost" {
		t.Errorf("%s: admin %s binds loopback: the kubelet's probes cannot reach it", name, cfg.Admin)
	}
	for probeName, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {idem.LivenessProbe, "/livez"}, "readiness": {idem.ReadinessProbe, "/readyz"}} {
		p := want.p
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", name, probeName)
			continue
		}
		if p.HTTPGet.Path != want.path {
			t.Errorf("%s: %s probe asks %s; want %s", name, probeName, p.HTTPGet.Path, want.path)
		}
		if got := containerPort(idem, p.HTTPGet.Port.String()); got != adminPort {
			t.Errorf("%s: %s probe on port %d; the admin listener is on %d", name, probeName, got, adminPort)
		}
	}
	_, proxyPort, err := splitPort(cfg.Listen)
	if err != nil || containerPort(idem, fmt.Sprint(proxyPort)) != proxyPort {
		t.Errorf("%s: listen %s is not a port of the container (%v)", name, cfg.Listen, err)
	}

	// Unprivileged, read-only, no capabilities, the runtime's seccomp profile.
	for _, c := range append(slices.Clone(pod.Containers), pod.InitContainers...) {
		checkSecurity(t, name+": container "+c.Name, pod.SecurityContext, c.SecurityContext)
	}
	if idem.Resources.Requests.Cpu().IsZero() || idem.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: idem requests no CPU or memory: %v", name, idem.Resources.Requests)
	}
	if lim := idem.Resources.Limits.Memory(); lim.IsZero() || lim.Cmp(*idem.Resources.Requests.Memory()) < 0 {
		t.Errorf("%s: idem's memory limit %v is not above its request", name, lim)
	}
	grace := 30 * time.Second // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if grace <= time.Duration(cfg.ShutdownTimeout) {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not outlast shutdown_timeout %v", name, grace, time.Duration(cfg.ShutdownTimeout))
	}

	// The Service sends clients to idem's port, on these pods.
	if len(o.services) != 1 {
		t.Fatalf("%s: %d Services; want 1", name, len(o.services))
	}
	svc := o.services[0]
	if !selects(svc.Spec.Selector, dep.Spec.Template.Labels) {
		t.Errorf("%s: the Service's selector %v does not select the pods %v", name, svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	for _, p := range svc.Spec.Ports {
		if containerPort(idem, p.TargetPort.String()) != proxyPort {
			t.Errorf("%s: the Service's port %s goes to %s, not to idem's %d", name, p.Name, p.TargetPort.String(), proxyPort)
		}
	}
	if !selects(dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
		t.Errorf("%s: the Deployment's selector does not select its pods", name)
	}
	return cfg
}

// checkStandalone: standalone set-ups have a PodDisruptionBudget over
// idem's pods that lets at least one go at a time.
func checkStandalone(t *testing.T, name string, o *objects) {
	t.Helper()
	if len(o.pdbs) != 1 {
		t.Fatalf("%s: %d PodDisruptionBudgets; want 1", name, len(o.pdbs))
	}
	pdb, dep := o.pdbs[0], o.deployments[0]
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Labels) {
		t.Errorf("%s: the PodDisruptionBudget does not select idem's pods", name)
	}
	if pdb.Spec.MinAvailable == nil || dep.Spec.Replicas == nil || pdb.Spec.MinAvailable.IntValue() >= int(*dep.Spec.Replicas) {
		t.Errorf("%s: minAvailable %v with %v replicas blocks every eviction", name, pdb.Spec.MinAvailable, dep.Spec.Replicas)
	}
}

func checkSecurity(t *testing.T, name string, pod *corev1.PodSecurityContext, c *corev1.SecurityContext) {
	t.Helper()
	if c == nil {
		t.Errorf("%s: no securityContext", name)
		return
	}
	nonRoot := c.RunAsNonRoot != nil && *c.RunAsNonRoot || c.RunAsNonRoot == nil && pod != nil && pod.RunAsNonRoot != nil && *pod.RunAsNonRoot
	if !nonRoot {
		t.Errorf("%s: runAsNonRoot is not true", name)
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem is not true", name)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", name)
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		t.Errorf("%s: capabilities %v; want drop ALL, add none", name, c.Capabilities)
	}
	seccomp := c.SeccompProfile
	if seccomp == nil && pod != nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: seccompProfile %v; want RuntimeDefault", name, seccomp)
	}
}

// mountedVolume finds the volume of c's mount that holds path, and the
// file's name within it.
func mountedVolume(t *testing.T, name string, pod corev1.PodSpec, c *corev1.Container, p string) (corev1.Volume, string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, p)
		if err != nil || strings.HasPrefix(rel, "..") || rel == "." {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: the mount %s is writable", name, m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name {
				if m.SubPath != "" {
					t.Errorf("%s: %s is a subPath mount, which never sees a change of its source", name, m.MountPath)
				}
				return v, path.Clean(rel)
			}
		}
		t.Fatalf("%s: the mount %s names no volume %s", name, m.MountPath, m.Name)
	}
	t.Fatalf("%s: %s is in no volume of container %s", name, p, c.Name)
	return corev1.Volume{}, ""
}

// containerPort is the number of c's port named or numbered port, or -1.
func containerPort(c *corev1.Container, port string) int {
	for _, p := range c.Ports {
		if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
			return int(p.ContainerPort)
		}
	}
	return -1
}

func splitPort(addr string) (string, int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("no port in %q", addr)
	}
	var port int
	_, err := fmt.Sscan(addr[i+1:], &port)
	return strings.Trim(addr[:i], "[]"), port, err
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesManifests: the plain manifests of deploy/kubernetes decode
// strictly and keep the invariants, in each set-up.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dir string
		s   setup
	}{{"sidecar", setup{sidecar: true}}, {"standalone", setup{}}} {
		file := deployPath("kubernetes", tc.dir, "idem.yaml")
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		o := decodeObjects(t, tc.dir, b)
		checkSetup(t, tc.dir, o, tc.s)
		if !tc.s.sidecar {
			checkStandalone(t, tc.dir, o)
		}
	}
}

// TestStrictDecodingRefusesUnknownFields: the decoding the tests rely on
// refuses a field the type lacks.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	var d appsv1.Deployment
	err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"), &d)
	if err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("a misspelt field: %v", err)
	}
}
