// Command pgleader shows who leads what, runs commands under an advisory
// lock or an election, and demonstrates failover on a throwaway
// PostgreSQL.
//
//	pgleader status [--json] [--watch]      list every advisory lock, holder and waiters
//	pgleader lock NAME -- cmd args...       run cmd once if the lock is free (like flock -n)
//	pgleader elect NAME -- cmd args...      run cmd while this process leads (active/passive)
//	pgleader resign NAME [--to ID]          ask NAME's leader to hand over, gracefully
//	pgleader history [NAME]                 terms, holders and why each ended (fencing on)
//	pgleader demo                           3 electors, a resign, a killed leader, a killed backend
//
// Every subcommand takes --dsn, or $DATABASE_URL. Exit codes: 0 success;
// 1 error; 2 usage; 75 lock held (lock, without --wait or after it); lock
// otherwise passes the command's exit code through (128+signal when it was
// killed by a signal). elect runs until stopped (0) or an error retrying
// cannot fix (1); its command may run many times, so it reports each exit
// code on stderr instead.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pgleader/pgleader/leader"
)

// Exit codes.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitLockHeld = 75 // EX_TEMPFAIL: try again later
	exitNoLeader = 3  // status NAME, resign NAME: nobody holds the lock
	exitRefused  = 4  // resign: refused, or no such candidate
)

const usage = `pgleader: leader election and advisory locks on PostgreSQL

Usage:
  pgleader status [--dsn DSN] [--json] [--watch] [--name NAME]... [NAME]
  pgleader lock   [--dsn DSN] [--wait DURATION] NAME -- COMMAND [ARGS...]
  pgleader elect  [--dsn DSN] [--grace DURATION] NAME -- COMMAND [ARGS...]
  pgleader resign [--dsn DSN] [--to IDENTITY] NAME
  pgleader history [--dsn DSN] [--since D] [--json] [NAME]
  pgleader demo   [--dsn DSN]
  pgleader version

Every subcommand takes --dsn or $DATABASE_URL. "pgleader CMD --help" shows
a subcommand's flags and examples.

Exit codes:
  0   success
  1   error (connection, SQL, ...)
  2   usage error
  75  lock held by another session (lock without --wait, or --wait ran out)
  3   status NAME, resign NAME: nobody leads NAME
  4   resign: the leader refused, or no candidate has that identity
  N   lock passes the command's exit code through; 128+SIG when the
      command was killed by signal SIG (elect does not: its command may run
      many times; it prints each exit code on stderr)
`

// usageError marks errors that exit with exitUsage; printed: the flag
// package has already said it.
type usageError struct {
	msg     string
	printed bool
}

func (e usageError) Error() string { return e.msg }

// exitCode carries a specific exit code out of a subcommand.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmds := map[string]func([]string, io.Writer, io.Writer) error{
		"status":    cmdStatus,
		"lock":      cmdLock,
		"elect":     cmdElect,
		"demo":      cmdDemo,
		"candidate": cmdCandidate,
		"version":   cmdVersion,
		"resign":    cmdResign,
		"history":   cmdHistory,
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	f, ok := cmds[name]
	if !ok {
		fmt.Fprintf(stderr, "pgleader: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}
	err := f(args[1:], stdout, stderr)
	var code exitCode
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintf(stderr, "pgleader %s: %v\n", name, err)
		}
		return exitUsage
	default:
		// The line already says "pgleader <command>:"; an error of ours
		// that opens with "pgleader: " would say it twice.
		fmt.Fprintf(stderr, "pgleader %s: %s\n", name, strings.TrimPrefix(err.Error(), "pgleader: "))
		return exitError
	}
}

// newFlags makes a FlagSet with --dsn and a usage text with examples.
// --dsn has no default in the flag set: $DATABASE_URL is read after
// parsing (dsnFlag.get), so that neither --help nor a usage error ever
// prints a connection string, and its password.
func newFlags(name, synopsis, examples string, stderr io.Writer) (*flag.FlagSet, *dsnFlag) {
	fs := flag.NewFlagSet("pgleader "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := &dsnFlag{}
	fs.Var(dsn, "dsn", "PostgreSQL connection string (default: $DATABASE_URL)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: pgleader %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
		if examples != "" {
			fmt.Fprintf(stderr, "\nExamples:\n%s", examples)
		}
	}
	return fs, dsn
}

// dsnFlag is --dsn. Its String, which the flag package prints, masks the
// password.
type dsnFlag struct{ v string }

func (d *dsnFlag) String() string {
	if d == nil {
		return ""
	}
	return leader.RedactDSN(d.v)
}

func (d *dsnFlag) Set(v string) error { d.v = v; return nil }

// get is --dsn, or $DATABASE_URL when it was not given.
func (d *dsnFlag) get() string {
	if d.v != "" {
		return d.v
	}
	return os.Getenv("DATABASE_URL")
}

// parseFlags parses args; a bad flag is a usage error (exit 2), and -h a
// request for help (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{msg: err.Error(), printed: true}
	}
	return err
}

func needDSN(dsn string) error {
	if strings.TrimSpace(dsn) == "" {
		return usageError{msg: "no database: pass --dsn or set DATABASE_URL"}
	}
	return nil
}

// splitCommand splits "NAME -- cmd args..." (the "--" is optional).
func splitCommand(rest []string) (name string, cmd []string, err error) {
	if len(rest) == 0 {
		return "", nil, usageError{msg: "missing NAME"}
	}
	name, rest = rest[0], rest[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return "", nil, usageError{msg: "missing COMMAND after NAME --"}
	}
	return name, rest, nil
}
