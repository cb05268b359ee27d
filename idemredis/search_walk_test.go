package idemredis

import (
	"context"
	"testing"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// TestWalkListsARecordOnce: a round of a search by age reads the pending
// and the settled range of the set by age by two commands, between which
// another client's script may complete a record, which the round then
// finds in both ranges. It must list it once. The ranges here are a
// ranger that finds the same record twice, as that round does.
func TestWalkListsARecordOnce(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	q := &search{s: s, p: idemstore.ListParams{Order: idemstore.OrderOldest}, byAge: true}
	rec := cand{key: idemstore.Key{Scope: "s", Operation: "op", Key: "k"}, order: "s\x00op\x00k", score: 1000}
	other := cand{key: idemstore.Key{Scope: "s", Operation: "op", Key: "l"}, order: "s\x00op\x00l", score: 2000}
	src := q.walk(ranger{
		cmds: func(int, *cand, *cand, int) rueidis.Commands { return nil },
		parse: func(_ []rueidis.RedisResult, _ *cand, _ int) ([]cand, bool, error) {
			return []cand{other, rec, rec}, false, nil // rec as pending, then as completed
		},
	})
	cands, more, err := src(context.Background(), nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 2 || cands[0].order != rec.order || cands[1].order != other.order || more {
		t.Errorf("walk = %+v, more %v; want the record once, then the other, and no more", cands, more)
	}
}
