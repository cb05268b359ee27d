package deploytest

import (
	"os"
	"os/exec"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestPrometheusRules: promtool checks the rules and runs their unit
// tests (deploy/prometheus/idem-rules.test.yaml), where each alert has a
// series that fires it and one that does not.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	promtool := needTool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "idem-rules.yaml"},
		{"test", "rules", "idem-rules.test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = deployPath("prometheus")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestEveryAlertIsTested: each alert of the rules has, in the promtool
// tests, an evaluation where it fires and one where it does not.
func TestEveryAlertIsTested(t *testing.T) {
	t.Parallel()
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	for file, into := range map[string]any{"idem-rules.yaml": &rules, "idem-rules.test.yaml": &tests} {
		b, err := os.ReadFile(deployPath("prometheus", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: tested firing %v, tested quiet %v; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if n < 5 {
		t.Errorf("%d alerts; want the five of docs/deploy.md", n)
	}
}
