package group

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// Config configures a Group. Zero durations take the defaults, the same as
// an elector's (1s, 3s, 6s, 5s, 500ms).
type Config struct {
	// Connect opens the member's connections: its main session and, unless
	// SingleConnection, its crash watch. leader.DSN(...) or any Connector.
	Connect leader.Connector
	// Group names the group: members with the same name on the same
	// database share its keys. 1 to 200 printable ASCII characters.
	Group string
	// Keys are the elections. Every member should have the same set (see
	// docs/groups.md for what happens while they differ). Duplicates are
	// an error; an empty set is allowed (the member joins and leads
	// nothing until SetKeys).
	Keys []leader.Key
	// Identity names this member; it becomes the connections'
	// application_name and must be unique in the group. Default
	// hostname-pid; 1 to 63 printable ASCII characters.
	Identity string
	// Callbacks run per key.
	Callbacks Callbacks
	// Logger receives structured logs; nil means none.
	Logger *zap.Logger

	// Priority, Version and Strategy rank this member, as an elector's
	// rank its candidate (see docs/rolling-upgrades.md): the keys are
	// spread over the best-ranked members only, and the others stand by
	// until no better-ranked member is left. So during a rolling upgrade
	// each key changes version once: under leader.NewestVersion when the
	// first member of the new version joins, under leader.OldestVersion
	// when the last member of the old version leaves. A ranked member's
	// sessions carry the rank in their application_name, after Identity
	// ("worker-1 [N0 1.8.0]"), where every member reads it; every member
	// of a group must use the same Strategy (while the ranked members
	// disagree on it, the group ignores ranks and warns). Default:
	// unranked (Priority 0, no Version), which ranks as Priority 0.
	Priority int
	// Version is this member's semantic version ("1.8.0"), required by
	// the version strategies.
	Version string
	// Strategy: leader.ByPriority (the default), leader.NewestVersion or
	// leader.OldestVersion.
	Strategy leader.Strategy

	// RenewInterval is how often a full round proves this member's session,
	// and with it every key the session holds: one round trip. A scan of
	// pg_locks, which proves each key by its lock and reads the members,
	// goes with it at the session's start, when the members change, and
	// every RenewInterval while it is cheap (0.5% of the member's time at
	// most: see docs/groups.md, "What a round proves"). Default 1s.
	RenewInterval time.Duration
	// RenewDeadline is the trust window: the member stops trusting every
	// key it leads (their contexts are cancelled) when no full round has
	// succeeded within RenewDeadline of when the last successful one was
	// sent. Greater than RenewInterval. Default 3s.
	RenewDeadline time.Duration
	// LeaseDuration is the server-side lease (the session's
	// idle_session_timeout): the server ends a silent member's session, and
	// frees its keys, this long after its last round. Greater than
	// RenewDeadline. Default 6s.
	LeaseDuration time.Duration
	// ReleaseTimeout bounds how long a key handed over gracefully (a
	// resign, a rebalance, Run's context ending) stays held, renewed,
	// while its OnElected returns; past it the key is released anyway and
	// an error is logged. Default 5s.
	ReleaseTimeout time.Duration
	// ReconnectMaxDelay caps the jittered exponential backoff between
	// sessions. Default 500ms.
	ReconnectMaxDelay time.Duration

	// Fencing installs a term per key at each of its elections (no history
	// table for groups yet).
	Fencing Fencing

	// Value is this member's value (see elector.Config.Value), at most
	// leader.MaxValueSize bytes: one per member, for every key it leads.
	// Each of the member's sessions writes it as it starts, to the values
	// table (Values), stamped with the session; leader.HolderValue,
	// elector.ObserveValues and pgleader status then report it with the
	// member as the leader of each of its keys, and never with another
	// member. nil: no value.
	Value []byte
	// Values configures the values table (see elector.Values).
	Values Values

	// SingleConnection turns the crash watch off: one connection per
	// member instead of two, and a member that dies is seen at the
	// survivors' next scan (up to RenewInterval later while scans are
	// cheap, a few thousand keys; longer in a larger group) instead of at
	// once. See docs/groups.md.
	SingleConnection bool
}

// Callbacks are a group's hooks, per key. OnElected is required.
type Callbacks struct {
	// OnElected runs in a goroutine of its own when this member is elected
	// for l.Key. ctx is cancelled the moment the key is in doubt or is
	// being handed over, with the reason as its cause. After a graceful
	// hand-over the key stays held, and renewed, until OnElected returns
	// (bounded by ReleaseTimeout); after a fault it is already gone, except
	// when the trust window closed with a round unanswered
	// (leader.ErrRenewDeadline: a slow server, a silent path): then the
	// session, if it lives, keeps the key until OnElected returns, again
	// bounded by ReleaseTimeout, so that no other member leads it
	// meanwhile. If it returns while still leading, the key is handed over
	// (leader.ErrCallbackReturned) and taken back a round later if it is
	// still this member's.
	OnElected func(ctx context.Context, l leader.Leadership)
	// OnDemoted runs once after each OnElected has returned (or
	// ReleaseTimeout passed), on a goroutine of its own, with the reason. A
	// key is not led again by this member before its OnDemoted has run. A
	// fault that ends the session while a key is handed over (its lock
	// lost before its OnElected returned) replaces the graceful reason.
	OnDemoted func(l leader.Leadership, reason error)
}

// Fencing configures fencing terms, per key (see leader.Fence).
type Fencing struct {
	// Enabled turns fencing on: the terms table is created when missing,
	// unless NoCreate.
	Enabled bool
	// Table is the terms table, "name" or "schema.name" (raw names, quoted
	// by pgleader). Default leader.DefaultTermsTable.
	Table string
	// NoCreate makes a missing table an error (leader.ErrNoTermsTable).
	NoCreate bool
	// TrustedOwner names a role whose terms table is used although this
	// member's role is not a member of it (see elector.Fencing).
	TrustedOwner string
}

// Values configures the table of members' values (see Config.Value and
// elector.Values).
type Values struct {
	// Table is the values table, "name" or "schema.name". Default
	// leader.DefaultValuesTable.
	Table string
	// NoCreate makes a missing table an error instead of creating it.
	NoCreate bool
	// TrustedOwner names a role whose values table is used although this
	// member's role is not a member of it.
	TrustedOwner string
}

// maxIdentity and maxGroup bound the names: PostgreSQL cuts
// application_name at 63 bytes.
const (
	maxIdentity = 63
	maxGroup    = 200
)

func (c *Config) durations() timing.Durations {
	return timing.Durations{RenewInterval: c.RenewInterval, RenewDeadline: c.RenewDeadline, LeaseDuration: c.LeaseDuration,
		ReleaseTimeout: c.ReleaseTimeout, ReconnectMaxDelay: c.ReconnectMaxDelay}
}

func (c *Config) setDefaults() {
	d := c.durations()
	d.SetDefaults()
	c.RenewInterval, c.RenewDeadline, c.LeaseDuration, c.ReleaseTimeout, c.ReconnectMaxDelay =
		d.RenewInterval, d.RenewDeadline, d.LeaseDuration, d.ReleaseTimeout, d.ReconnectMaxDelay
	if c.Identity == "" {
		c.Identity = leader.DefaultIdentity()
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Fencing.Enabled && c.Fencing.Table == "" {
		c.Fencing.Table = leader.DefaultTermsTable
	}
	if c.Values.Table == "" {
		c.Values.Table = leader.DefaultValuesTable
	}
}

func (c *Config) validate() error {
	bad := func(field, rule string, args ...any) error {
		return &leader.ConfigError{Field: field, Rule: fmt.Sprintf(rule, args...)}
	}
	switch {
	case c.Connect == nil:
		return bad("Connect", "required (use leader.DSN(...) or a ConnectFunc)")
	case c.Callbacks.OnElected == nil:
		return bad("Callbacks.OnElected", "required")
	}
	if err := timing.Printable(c.Group, maxGroup); err != nil {
		return bad("Group", "%v", err)
	}
	if err := timing.Printable(c.Identity, maxIdentity); err != nil {
		return bad("Identity", "%v (PostgreSQL cuts and replaces characters in application_name)", err)
	}
	if err := c.validateRank(); err != nil {
		return err
	}
	if err := c.durations().Validate(); err != nil {
		return err
	}
	if c.Fencing.Enabled {
		if _, err := terms.Quote(c.Fencing.Table); err != nil {
			return bad("Fencing.Table", "%v", err)
		}
	}
	if len(c.Value) > leader.MaxValueSize {
		return bad("Value", "must be at most %d bytes, got %d", leader.MaxValueSize, len(c.Value))
	}
	if _, err := terms.Quote(c.Values.Table); err != nil {
		return bad("Values.Table", "%v", err)
	}
	if err := leader.ConnectorError(c.Connect); err != nil {
		return &leader.ConfigError{Field: "Connect", Rule: err.Error()}
	}
	return nil
}

// validateRank checks Priority, Version and Strategy, and that the
// member's application_name, with its rank, fits.
func (c *Config) validateRank() error {
	bad := func(field, rule string, args ...any) error {
		return &leader.ConfigError{Field: field, Rule: fmt.Sprintf(rule, args...)}
	}
	switch {
	case c.Strategy < leader.ByPriority || c.Strategy > leader.OldestVersion:
		return bad("Strategy", "must be leader.ByPriority, leader.NewestVersion or leader.OldestVersion, got %d", int(c.Strategy))
	case c.Strategy != leader.ByPriority && c.Version == "":
		return bad("Version", "required with Strategy %s", c.Strategy)
	}
	if c.Version != "" {
		if err := leader.ValidVersion(c.Version); err != nil {
			return bad("Version", "%v", err)
		}
	}
	if _, _, ok := leader.ParseApplicationName(c.Identity); ok {
		return bad("Identity", "must not end like a member's rank (%q): ranked members' application_names do", " [P0]")
	}
	if app := c.appName(); len(app) > maxIdentity {
		return bad("Identity", "with the member's rank, its application_name %q is %d bytes; PostgreSQL keeps %d: shorten Identity or Version", app, len(app), maxIdentity)
	}
	return nil
}

// ranked reports whether this member carries a rank: anything but the
// default.
func (c *Config) ranked() bool { return c.Priority != 0 || c.Version != "" }

// appName is the application_name of this member's sessions: Identity,
// and the rank of a ranked member.
func (c *Config) appName() string {
	if !c.ranked() {
		return c.Identity
	}
	return (leader.Rank{Strategy: c.Strategy, Preference: leader.Preference{Priority: c.Priority, Version: c.Version}}).ApplicationName(c.Identity)
}

// ErrLockTable is returned (wrapped) by Run when the server's shared lock
// table can never hold the group (checked at every session's start): see
// LockTableError. A table that fits the group but that another session
// has filled (SQLSTATE 53200 while taking keys) is no error: the member
// takes no key until the table has room, keeps what it leads, and says so
// (Status().LockTableFull and LastError, a Warn at most once a minute).
var ErrLockTable = errors.New("pgleader: the server's lock table is too small for this group")

// LockTableError says how big the server's lock table is and what the
// group needs. PostgreSQL's shared lock table holds about
// max_locks_per_transaction × (max_connections + max_prepared_transactions)
// locks for the whole server; a group may use at most half of it, so that
// the application keeps room.
type LockTableError struct {
	Keys     int // the group's keys
	Capacity int // the server's lock table
	// MaxLocksPerTransaction is the setting that would fit the group,
	// with the server's max_connections and max_prepared_transactions.
	MaxLocksPerTransaction int
	Err                    error // the server's error (SQLSTATE 53200), when it came to that
}

// Error says what the group needs and how to get it.
func (e *LockTableError) Error() string {
	s := fmt.Sprintf("%v: %d keys need room for %d locks, and the server's lock table holds about %d (max_locks_per_transaction × (max_connections + max_prepared_transactions)); set max_locks_per_transaction to at least %d (a restart), or split the keys",
		ErrLockTable, e.Keys, 2*e.Keys, e.Capacity, e.MaxLocksPerTransaction)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap makes errors.Is(err, ErrLockTable) true, and reaches the server's
// error.
func (e *LockTableError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrLockTable, e.Err}
	}
	return []error{ErrLockTable}
}

// ErrAlreadyRunning is returned by Run when the Group has run before.
var ErrAlreadyRunning = errors.New("pgleader: group: Run called more than once")
