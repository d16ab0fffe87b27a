package statestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
)

// holdWriteLock opens db with a plain database/sql connection, begins an
// immediate transaction, reports "locked", and holds it until wait returns.
func holdWriteLock(db string, wait func(), out *json.Encoder) error {
	conn, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx := context.Background()
	c, err := conn.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	_ = out.Encode(event{Event: "locked"})
	wait()
	_, err = c.ExecContext(ctx, "ROLLBACK")
	return err
}
