package deploytest

import (
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"sigs.k8s.io/yaml"
)

// renderChart renders deploy/helm/idem with values (YAML) over the chart's
// own, as helm template does, and returns the manifests in file order.
func renderChart(t *testing.T, values string) ([]byte, error) {
	t.Helper()
	ch, err := loader.Load(deployPath("helm", "idem"))
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatalf("values: %v", err)
	}
	rv, err := util.ToRenderValuesWithSchemaValidation(ch, vals, common.ReleaseOptions{Name: "payments", Namespace: "default", IsInstall: true}, nil, false)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for name := range out {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var stream strings.Builder
	for _, name := range names {
		stream.WriteString("---\n# " + name + "\n" + out[name] + "\n")
	}
	return []byte(stream.String()), nil
}

// TestHelmChart renders the chart in both modes and with a few values,
// decodes every object strictly into its k8s.io/api type, and checks the
// invariants the plain manifests keep.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, values string
		sidecar      bool
		check        func(t *testing.T, o *objects)
	}{
		{name: "standalone", values: "config: {upstream: 'http://payments-app.default.svc:80'}"},
		{name: "standalone, 5 replicas, routes, sealed answers, a Secret made by the chart", values: `
replicas: 5
podDisruptionBudget: {minAvailable: 3}
config:
  upstream: http://payments-app:80
  retention: 12h
  routes:
    - match: POST /payments
      retention: 48h
    - match: POST /refunds
      mode: observe
secret:
  create: true
  encryption_key_file: encryption-keys
  data: {store-url: 'postgres://idem:pw@db:5432/idem', scope-secret: 0123456789abcdef0123, admin-tokens: 'ops:0123456789abcdef', encryption-keys: 'k1:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'}
`, check: func(t *testing.T, o *objects) {
			if len(o.secrets) != 1 || o.secrets[0].StringData["store-url"] == "" {
				t.Errorf("no Secret made from secret.data: %v", o.secrets)
			}
			if r := o.deployments[0].Spec.Replicas; r == nil || *r != 5 {
				t.Errorf("replicas %v; want 5", r)
			}
		}},
		{name: "sidecar", sidecar: true, values: "mode: sidecar\napp: {image: registry.example.com/payments:1.0.0}"},
		{name: "sidecar, a SQLite store, other ports", sidecar: true, values: `
mode: sidecar
ports: {proxy: 8081, admin: 9091}
secret: {store: ""}
config:
  store: memory://
  shutdown_timeout: 20s
app: {name: orders, image: registry.example.com/orders:2, port: 8000}
`, check: func(t *testing.T, o *objects) {
			for _, c := range o.deployments[0].Spec.Template.Spec.InitContainers {
				for _, e := range c.Env {
					if e.Name == "IDEM_STORE_FILE" {
						t.Errorf("IDEM_STORE_FILE with secret.store empty")
					}
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := renderChart(t, tc.values)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decodeObjects(t, tc.name, out)
			cfg := checkSetup(t, tc.name, o, setup{sidecar: tc.sidecar})
			if tc.sidecar {
				if len(o.pdbs) != 0 {
					t.Errorf("a PodDisruptionBudget in sidecar mode")
				}
				if !strings.HasPrefix(cfg.Upstream, "http://127.0.0.1:") {
					t.Errorf("the sidecar's upstream %s is not the app on loopback", cfg.Upstream)
				}
			} else {
				checkStandalone(t, tc.name, o)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

// TestHelmChartRefuses: values that cannot work stop the rendering with a
// message that says why.
func TestHelmChartRefuses(t *testing.T) {
	t.Parallel()
	for values, want := range map[string]string{
		"mode: daemonset\nconfig: {upstream: 'http://a'}":   "mode",
		"config: {upstream: ''}":                            "config.upstream is required",
		"mode: sidecar":                                     "app.image is required",
		"config: {upstream: 'http://a', listen: ':1'}":      "config",
		"config: {upstream: 'http://a'}\nports: {proxy: 0}": "proxy",
	} {
		if _, err := renderChart(t, values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error naming %q", values, err, want)
		}
	}
}

// TestHelmLint: helm lint's checks pass in both modes.
func TestHelmLint(t *testing.T) {
	t.Parallel()
	for _, values := range []map[string]any{
		{"config": map[string]any{"upstream": "http://payments-app:80"}},
		{"mode": "sidecar", "app": map[string]any{"image": "registry.example.com/payments:1"}},
	} {
		l := lint.RunAll(deployPath("helm", "idem"), values, "default")
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (%v): %s", values, m)
			}
		}
	}
}
