package leader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/wire/terms"
)

// DefaultTermsTable is the table that holds fencing terms unless configured
// otherwise.
const DefaultTermsTable = "pgleader_terms"

// DefaultHistoryTable is the table that keeps a row per term (see
// elector.Fencing) unless configured otherwise.
const DefaultHistoryTable = "pgleader_history"

// HistoryTableSQL returns the DDL of a history table, for users who create
// it themselves; the application's role then needs SELECT, INSERT, UPDATE
// and DELETE on it.
func HistoryTableSQL(table string) string { return terms.HistoryDDL(table) + ";" }

// TermsTableSQL returns the DDL of a terms table, for users who create it
// themselves (for example when the application's role has no CREATE
// privilege). The application's role then needs SELECT, INSERT and UPDATE
// on it.
func TermsTableSQL(table string) string { return terms.DDL(table) + ";" }

// Fence checks, inside tx, that term is still the newest term of key in
// table, and holds a share lock on the term row until tx ends. Call it in
// every transaction whose writes must be refused once a newer leader exists,
// before those writes, and commit the transaction only if it returns nil.
//
// Why it works: a new leader installs its term with an UPDATE of the same
// row before its OnElected runs. The UPDATE waits for every transaction
// holding the share lock, and a Fence that comes after the UPDATE commits
// reads the new term. So either the fenced transaction commits before the
// newer term exists, or Fence returns an error that matches ErrFenced. No
// transaction of an older leader that called Fence can commit after a newer
// term has been installed.
func Fence(ctx context.Context, tx pgx.Tx, table string, key Key, term int64) error {
	q, err := terms.Quote(table)
	if err != nil {
		return err
	}
	classid, objid, objsubid := key.LockTag()
	var current int64
	err = tx.QueryRow(ctx, terms.FenceSQL(q), classid, objid, objsubid).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: no term recorded for key %s in %s", ErrFenced, key, table)
	case err != nil:
		return terms.Classify(err, table)
	case current != term:
		return &FencedError{Key: key, Term: term, Current: current}
	}
	return nil
}

// Fence is Fence(ctx, tx, l.TermsTable, l.Key, l.Term).
func (l Leadership) Fence(ctx context.Context, tx pgx.Tx) error {
	if l.TermsTable == "" {
		return ErrNoFencing
	}
	return Fence(ctx, tx, l.TermsTable, l.Key, l.Term)
}
