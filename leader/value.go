package leader

import (
	"context"
	"fmt"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
)

// DefaultValuesTable is the table that holds leaders' values (see
// elector.Config.Value) unless configured otherwise.
const DefaultValuesTable = "pgleader_values"

// MaxValueSize bounds a leader's value: 8 KiB. A value says where the
// leader is or what it serves (an address, a small JSON document), and
// every follower and observer reads it again at each change of leader and
// each Proclaim, so it stays one small row; a larger payload belongs in a
// table of the application's, with its key in the value.
const MaxValueSize = lockconn.MaxValue

// ValuesTableSQL returns the DDL of a values table, for users who create it
// themselves. Leaders' roles need SELECT, INSERT and UPDATE on it; readers
// (observers, leader.HolderValue) need SELECT.
func ValuesTableSQL(table string) string { return terms.ValuesDDL(table) + ";" }

// Proclamation is a leader and the value it proclaimed.
type Proclamation struct {
	// Identity is the leader's identity; "" when nobody leads.
	Identity string
	// Value is the leader's value: nil when nobody leads, or when the
	// leader has not written one (yet: a new leader writes its value right
	// after it announces itself), or keeps none.
	Value []byte
}

// HolderValue returns who holds key and the value it proclaimed in the
// values table (DefaultValuesTable when table is ""; name its schema,
// "schema.table", when the caller's search_path may find another role's
// table first). The value is paired with the holder on the holder's own
// backend pid, session start and identity: a value an earlier leader wrote
// is never returned with a later leader's identity; until the new leader
// writes its own, Value is nil. A value in a table whose owner is neither
// the caller's role, a role it is a member of, trustedOwner, nor a
// superuser is refused with ErrForeignTable. With nobody holding key it
// returns ErrNoLeader. Like Holder it needs no privilege beyond SELECT on
// the table.
func HolderValue(ctx context.Context, q Querier, key Key, table, trustedOwner string) (Proclamation, error) {
	if !key.Valid() {
		return Proclamation{}, &ConfigError{Field: "key", Rule: "must be a valid key"}
	}
	if table == "" {
		table = DefaultValuesTable
	}
	quoted, err := terms.Quote(table)
	if err != nil {
		return Proclamation{}, &ConfigError{Field: "table", Rule: err.Error()}
	}
	v, err := lockconn.ReadValue(ctx, q, lockconn.TagOf(key).ValueSQL(quoted), trustedOwner)
	switch {
	case err != nil:
		return Proclamation{}, fmt.Errorf("read the leader's value: %w", terms.Classify(err, table))
	case v.Free:
		return Proclamation{}, ErrNoLeader
	}
	return Proclamation{Identity: v.Holder, Value: v.Value}, nil
}
