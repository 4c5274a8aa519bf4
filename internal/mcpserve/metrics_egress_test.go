package mcpserve

import (
	"strings"
	"testing"
)

// The egress counters appear per project and decision, in the Prometheus text.
func TestMetricsEgress(t *testing.T) {
	m := newMetrics([]string{"bash"})
	m.egress = func() map[string][2]int64 { return map[string][2]int64{"shop": {7, 2}, "blog": {1, 0}} }
	var b strings.Builder
	if _, err := m.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# TYPE toolhost_egress_connections_total counter\n",
		`toolhost_egress_connections_total{project="blog",decision="allow"} 1` + "\n",
		`toolhost_egress_connections_total{project="shop",decision="allow"} 7` + "\n",
		`toolhost_egress_connections_total{project="shop",decision="deny"} 2` + "\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
	if strings.Index(b.String(), `project="blog"`) > strings.Index(b.String(), `project="shop"`) {
		t.Error("projects are not sorted")
	}
}
