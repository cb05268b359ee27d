package idemproxy

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// TestReplayMemoryGauges: idem_proxy_replay_memory_bytes shows what the
// replays hold of max_replay_memory now, and the limit gauge the setting.
func TestReplayMemoryGauges(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	defer mem.Close()
	e, err := idem.NewEngine(mem, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]byte("upstream: http://127.0.0.1:1\nanonymous: shared\nmax_replay_memory: 8388608\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(e, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	m.watchProxy(p)
	if !p.replays.TryAcquire(3 << 20) {
		t.Fatal("the replay budget refused 3 MiB of 8")
	}
	const want = `
# HELP idem_proxy_replay_memory_bytes Bytes of stored answers held in memory now while they are read from the store and written to clients, against idem_proxy_replay_memory_limit_bytes (max_replay_memory); a replay that does not fit gets 503 busy.
# TYPE idem_proxy_replay_memory_bytes gauge
idem_proxy_replay_memory_bytes 3.145728e+06
# HELP idem_proxy_replay_memory_limit_bytes The max_replay_memory setting: bytes of stored answers that may be held in memory at once while clients read their replays.
# TYPE idem_proxy_replay_memory_limit_bytes gauge
idem_proxy_replay_memory_limit_bytes 8.388608e+06
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "idem_proxy_replay_memory_bytes", "idem_proxy_replay_memory_limit_bytes"); err != nil {
		t.Error(err)
	}
	p.replays.Release(3 << 20)
	if got := p.replays.Used(); got != 0 {
		t.Errorf("after the release, %d bytes held", got)
	}
}
