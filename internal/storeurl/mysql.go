package storeurl

import (
	"context"
	"database/sql"
	"database/sql/driver"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
)

// mysqlConnector builds its connector on first use, so that a config error
// surfaces as a connection error instead of a panic.
type mysqlConnector struct{ cfg *mysql.Config }

func (c *mysqlConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := mysql.NewConnector(c.cfg)
	if err != nil {
		return nil, err
	}
	return conn.Connect(ctx)
}

func (c *mysqlConnector) Driver() driver.Driver { return &mysql.MySQLDriver{} }

func openMySQL(ctx context.Context, db *sql.DB, migrate, batchOff bool) (idemstore.Store, error) {
	cfg := idemmysql.Config{DisableBatch: batchOff}
	if migrate {
		if err := idemmysql.Migrate(ctx, db, cfg); err != nil {
			return nil, err
		}
	}
	return idemmysql.New(db, cfg)
}
