package lab

import (
	"fmt"
	"strings"
)

// why explains, per database, strategy and level, the mechanism behind a
// row: what the database does with these statements, true whether or not
// a given run hit the race.
var why = map[string]map[Strategy]map[Isolation]string{
	"PostgreSQL": {
		CheckThenInsert: {
			ReadCommitted: "at READ COMMITTED each SELECT sees only rows committed before it began, so every worker that checks " +
				"before the first insert commits finds nothing and inserts",
			RepeatableRead: "REPEATABLE READ only freezes each worker's snapshot: the others' inserts stay invisible to it, " +
				"and PostgreSQL does not check at commit that what was read still holds",
			Serializable: "SERIALIZABLE (SSI) sees that each worker read the key another inserted and aborts all but the first " +
				"to commit with 40001: nothing ran twice, but each loser's client gets an error to retry",
		},
		SelectForUpdate: {
			ReadCommitted: "FOR UPDATE locks the rows the SELECT returns, and a row that does not exist yet is not returned: " +
				"it locks nothing, and the strategy is a plain check",
			RepeatableRead: "FOR UPDATE on a row that does not exist yet locks nothing at this level either, " +
				"and the snapshot hides the others' inserts",
			Serializable: "only SERIALIZABLE's predicate locks catch the race, failing the losers with 40001; " +
				"the FOR UPDATE adds nothing",
		},
		InsertFirst: {
			ReadCommitted: "the primary key admits one row; ON CONFLICT DO NOTHING tells each loser \"no row inserted\" " +
				"without an error, so it replays the winner's answer instead of running",
			RepeatableRead: "the primary key admits one row; at this level ON CONFLICT DO NOTHING may not skip a row " +
				"its snapshot cannot see, so losers that raced the winner get 40001 instead of \"no row\"; " +
				"a retry sees the row (idem's store retries, and reserves in an autocommit statement of its own)",
			Serializable: "the primary key admits one row; losers that raced the winner get 40001 instead of \"no row\" " +
				"(ON CONFLICT cannot skip a row the snapshot does not show); a retry sees the row, " +
				"and idem's store retries",
		},
	},
	"MySQL": {
		CheckThenInsert: {
			ReadCommitted: "a plain SELECT is a consistent read that takes no locks: every worker sees no row and inserts",
			RepeatableRead: "a plain SELECT reads the snapshot without locks at REPEATABLE READ too: every worker sees " +
				"no row and inserts",
			Serializable: "at SERIALIZABLE InnoDB makes each plain SELECT a locking read: every worker takes a shared lock " +
				"on the gap where the key would go, then each insert waits for the others' gap locks, a deadlock " +
				"InnoDB breaks (1213) by rolling back all but one",
		},
		SelectForUpdate: {
			ReadCommitted: "READ COMMITTED turns InnoDB's gap locks off: FOR UPDATE on a key that is not there locks nothing, " +
				"and the strategy is a plain check",
			RepeatableRead: "FOR UPDATE on a key that is not there takes a gap lock; gap locks do not conflict, so every " +
				"worker gets one, then each insert waits for the others' gap locks: a deadlock InnoDB breaks (1213) " +
				"by rolling back all but one",
			Serializable: "as at REPEATABLE READ: every worker's FOR UPDATE takes a gap lock, and the inserts deadlock " +
				"on each other's gap locks (1213)",
		},
		InsertFirst: {
			ReadCommitted: "the primary key admits one row: each loser's INSERT waits for the winner's commit, then gets " +
				"duplicate key 1062, which tells it the key is taken (idem's MySQL store replays); " +
				"no gap lock is taken, so nothing can deadlock",
			RepeatableRead: "the primary key admits one row: losers wait for the winner's commit and get duplicate key 1062, " +
				"handled as \"taken\"; no read came first, so no gap lock, no deadlock",
			Serializable: "the primary key admits one row: losers wait for the winner's commit and get duplicate key 1062, " +
				"handled as \"taken\"; no read came first, so no gap lock, no deadlock",
		},
	},
	"SQLite": {
		CheckThenInsert: {
			Serializable: "SQLite writes one transaction at a time: in a deferred transaction (plain BEGIN) every worker " +
				"reads, then the first to write wins; a loser that still reads while the winner writes is refused at once " +
				"with SQLITE_BUSY, as waiting could deadlock (counted as deadlocks), one whose snapshot the winner's " +
				"commit made stale gets SQLITE_BUSY_SNAPSHOT (counted as serialization failures): no duplicate, " +
				"but an error for each loser's client",
		},
		SelectForUpdate: {
			Serializable: "SQLite has no FOR UPDATE; its nearest thing, BEGIN IMMEDIATE, takes the database's one write lock " +
				"before the check, so the workers run one after the other and the later ones see the row: right, " +
				"by shutting every other writer out of the whole file (the lab's barrier cannot apply)",
		},
		InsertFirst: {
			Serializable: "the primary key admits one row; ON CONFLICT DO NOTHING tells each loser \"no row inserted\" " +
				"without an error",
		},
	},
}

// shows says in plain words what a row shows: what was counted, then why.
func shows(db string, res Result, cfg Config) string {
	var b strings.Builder
	switch {
	case res.Duplicates > 0:
		fmt.Fprintf(&b, "up to %d of %d workers ran the operation for one key, %d duplicate executions over %d keys",
			res.MaxExecutionsPerKey, cfg.Concurrency, res.Duplicates, res.Rounds)
	case res.MaxExecutionsPerKey == 1 && res.NoWinnerRounds == 0:
		b.WriteString("one execution per key")
	case res.MaxExecutionsPerKey == 1:
		b.WriteString("at most one execution per key")
	default:
		b.WriteString("no key ran at all")
	}
	var errs []string
	for _, e := range []struct {
		n    int
		what string
	}{
		{res.Deadlocks, "deadlocks"},
		{res.SerializationFailures, "serialization failures"},
		{res.UniqueViolations, "unique violations"},
		{res.OtherErrors, "other errors"},
	} {
		if e.n > 0 {
			errs = append(errs, fmt.Sprintf("%d %s", e.n, e.what))
		}
	}
	switch {
	case len(errs) > 0 && res.Duplicates > 0:
		b.WriteString(", and " + andList(errs) + " for the clients")
	case len(errs) > 0:
		b.WriteString(", but " + andList(errs) + " reached the losers' clients")
	default:
		b.WriteString(", and no errors")
	}
	if res.NoWinnerRounds > 0 && res.MaxExecutionsPerKey > 0 {
		fmt.Fprintf(&b, "; %d keys ran nowhere until a client retries", res.NoWinnerRounds)
	}
	if w := why[db][res.Strategy][res.Isolation]; w != "" {
		b.WriteString(". Why: " + w)
	}
	if res.UniqueViolations > 0 && res.Strategy != InsertFirst {
		b.WriteString("; the unique constraint on the key refused each second row, with an error the loser's client sees")
	}
	if res.LockTimeouts > 0 {
		fmt.Fprintf(&b, "; %d of the deadlocks were lock wait timeouts", res.LockTimeouts)
	}
	if res.BarrierTimeouts > 0 {
		fmt.Fprintf(&b, "; in %d rounds a worker did not reach the barrier in %v and the others went on", res.BarrierTimeouts, barrierBound)
	}
	if res.FirstOtherError != "" {
		b.WriteString("; first other error: " + res.FirstOtherError)
	}
	return upperFirst(b.String()) + "."
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// andList joins "a", "b", "c" as "a, b and c".
func andList(items []string) string {
	if len(items) <= 1 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
