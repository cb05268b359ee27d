package idem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// Do runs a job's effect at most once per key, however often the queue
// delivers the job, and gives later deliveries the first result, typed.
func ExampleDo() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	type Receipt struct {
		Invoice string `json:"invoice"`
		Sent    int    `json:"sent"`
	}
	// The job's arguments are what a retry must repeat.
	args, _ := json.Marshal(map[string]string{"invoice": "in_42", "to": "ada@example.com"})
	fp, err := idem.Fingerprint(idem.FingerprintInput{Operation: "send-invoice", ContentType: "application/json", Body: args}, idem.FingerprintOptions{})
	if err != nil {
		log.Fatal(err)
	}
	req := idem.Request{
		Key:         idem.Key{Scope: "tenant-7", Operation: "send-invoice", Key: "in_42"},
		Fingerprint: fp,
		Kind:        idem.External, // the mail goes out through another service
	}

	sent := 0
	for delivery := 1; delivery <= 2; delivery++ {
		r, err := idem.Do(context.Background(), engine, req, func(ctx context.Context) (Receipt, error) {
			sent++ // here: call the mail service, passing the key along
			return Receipt{Invoice: "in_42", Sent: sent}, nil
		})
		if errors.Is(err, idem.ErrInFlight) {
			continue // another worker has it; the queue retries later
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("delivery %d: %+v\n", delivery, r)
	}
	fmt.Println("mails sent:", sent)
	// Output:
	// delivery 1: {Invoice:in_42 Sent:1}
	// delivery 2: {Invoice:in_42 Sent:1}
	// mails sent: 1
}

// DoTx makes a job's database change and its stored result commit
// together: a worker that dies after the commit, before the queue heard of
// it, changes nothing more when the job comes again.
func ExampleDoTx() {
	db, store, cleanup := openSQLite()
	defer cleanup()
	if _, err := db.Exec(`CREATE TABLE ledger (payout TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	req := idem.Request{
		Key:         idem.Key{Scope: "payouts", Operation: "pay-out", Key: "po_1"},
		Fingerprint: "v1:po_1-500",
		Kind:        idem.Transactional, // the effect is in the transaction only
	}
	for delivery := 1; delivery <= 2; delivery++ {
		entry, err := idem.DoTx(context.Background(), engine, req, idem.SQLTx(db, nil), func(ctx context.Context, tx *sql.Tx) (int64, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO ledger (payout, amount) VALUES ('po_1', 500)`)
			if err != nil {
				return 0, err
			}
			return res.LastInsertId()
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("delivery %d: ledger entry %d\n", delivery, entry)
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", rows)
	// Output:
	// delivery 1: ledger entry 1
	// delivery 2: ledger entry 1
	// ledger rows: 1
}
