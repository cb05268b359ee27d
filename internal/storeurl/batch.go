package storeurl

import (
	"fmt"

	"github.com/go-sql-driver/mysql"
)

// The batch parameter of sqlite://, postgres:// and mysql:// URLs turns
// the store's group commit off (batch=off) or leaves it on (batch=on, the
// default): with it on, calls that arrive while the store is writing are
// written together in one transaction.

// parseBatch reads the value of batch: on or off.
func parseBatch(v string) (off bool, err error) {
	switch v {
	case "on":
		return false, nil
	case "off":
		return true, nil
	}
	return false, fmt.Errorf("batch must be on or off, got %q", v)
}

// takeBatch removes the batch parameter from a postgres:// URL, which pgx
// would otherwise send to the server as a setting, and reads it.
func takeBatch(rawURL string) (string, bool, error) {
	rawURL, v, err := takeParam(rawURL, "batch", "on")
	if err != nil || v == "" {
		return rawURL, false, err
	}
	off, err := parseBatch(v)
	return rawURL, off, err
}

// popMySQLBatch removes the batch parameter from a parsed MySQL DSN, whose
// unknown parameters the driver would otherwise send as session variables,
// and reads it.
func popMySQLBatch(cfg *mysql.Config) (bool, error) {
	v, ok := cfg.Params["batch"]
	if !ok {
		return false, nil
	}
	delete(cfg.Params, "batch")
	return parseBatch(v)
}
