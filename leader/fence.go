package leader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgleader/pgleader/internal/terms"
)

// DefaultTermsTable is the table that holds fencing terms unless configured
// otherwise.
const DefaultTermsTable = "pgleader_terms"

// ErrFenced is returned by Fence when a newer term exists: a later leader
// has been elected, and the caller must not write.
var ErrFenced = errors.New("pgleader: fenced: a newer leader's term exists")

// ErrNoTermsTable means fencing is on but the terms table is missing or not
// accessible. The error text carries the SQL that creates it.
var ErrNoTermsTable = terms.ErrNoTable

// ErrNoFencing is returned by Leadership.Fence when the elector runs without
// fencing (the Leadership has no term).
var ErrNoFencing = errors.New("pgleader: fencing is not enabled for this election")

// FencedError is the error Fence returns for a stale term. It matches
// ErrFenced with errors.Is.
type FencedError struct {
	Key     Key
	Term    int64 // the caller's term
	Current int64 // the newest term in the table
}

// Error says which term is stale and which is current.
func (e *FencedError) Error() string {
	return fmt.Sprintf("pgleader: fenced: key %s: term %d is stale, the current term is %d", e.Key, e.Term, e.Current)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

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
