package elector

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgleader/pgleader/internal/wire/lockconn"
	"github.com/pgleader/pgleader/internal/wire/terms"
	"github.com/pgleader/pgleader/internal/wire/timing"
	"github.com/pgleader/pgleader/leader"
)

// Defaults for the timing fields of Config. See docs/tuning.md.
const (
	DefaultRenewInterval     = timing.DefaultRenewInterval
	DefaultRenewDeadline     = timing.DefaultRenewDeadline
	DefaultLeaseDuration     = timing.DefaultLeaseDuration
	DefaultReleaseTimeout    = timing.DefaultReleaseTimeout
	DefaultReconnectMaxDelay = timing.DefaultReconnectMaxDelay
	// DefaultHistoryRetention is how long history rows are kept.
	DefaultHistoryRetention = 30 * 24 * time.Hour
)

// maxIdentityLen is the longest application_name PostgreSQL keeps
// (NAMEDATALEN - 1); longer names are cut by the server.
const maxIdentityLen = 63

// ErrInvalidConfig is wrapped by every error New returns for a bad Config
// (it is leader.ErrInvalidConfig).
var ErrInvalidConfig = leader.ErrInvalidConfig

// ConfigError names the Config field that is wrong and the rule it breaks
// (it is leader.ConfigError). It wraps ErrInvalidConfig.
type ConfigError = leader.ConfigError

// Connector opens the elector's dedicated connection (see leader.Connector).
type Connector = leader.Connector

// ConnectFunc adapts a function to Connector.
type ConnectFunc = leader.ConnectFunc

// DSN returns a Connector for a PostgreSQL connection string; see
// leader.DSN. A string that does not parse makes New fail, and the error
// never shows the password.
func DSN(dsn string) Connector { return leader.DSN(dsn) }

// Callbacks are the elector's hooks. Only OnElected is required.
type Callbacks struct {
	// OnElected runs in its own goroutine when this elector becomes the
	// leader, started right after the lock check and before any other
	// callback or log. ctx is cancelled the moment leadership is in doubt
	// or a step-down begins, with the reason as its cause (context.Cause).
	// OnElected should return soon after ctx is done. After a graceful
	// step-down (Resign, Run's context, OnElected returning) the lock is
	// kept, and renewed, until it returns, bounded by ReleaseTimeout; after
	// a fault the lock is already gone, except when the trust window closed
	// with a renew unanswered (leader.ErrRenewDeadline: a slow server, a
	// silent path): then the session, if it lives, keeps the lock until
	// OnElected returns, again bounded by ReleaseTimeout, so that no other
	// candidate leads meanwhile. If it returns while still leader,
	// the elector resigns (reason leader.ErrCallbackReturned) and campaigns
	// again after one RenewInterval. To resign from inside, call
	// Resign(ctx) with this ctx, or return. A panic in OnElected is not
	// recovered: as in any goroutine, it ends the process (no OnDemoted
	// runs; the server frees the lock when the connection dies). Recover
	// inside OnElected to survive one.
	OnElected func(ctx context.Context, l leader.Leadership)
	// OnDemoted is called exactly once after each OnElected, and never
	// without one, once OnElected has returned (or ReleaseTimeout passed).
	// reason is one of leader.ErrConnectionLost, ErrLockLost,
	// ErrRenewDeadline, ErrResigned, ErrCallbackReturned,
	// ErrTransactionPooling, ErrStandby, or Run's context error; a fault
	// during a graceful step-down's drain replaces the graceful reason.
	// The server's *pgconn.PgError, when there is one, is in the chain. It
	// runs on the elector's goroutine: return quickly.
	OnDemoted func(l leader.Leadership, reason error)
	// OnNewLeader is called with the identity of a new leader whenever the
	// elector sees the holder change, this elector included. Followers learn
	// it during their campaign rounds, with no extra queries. It runs on a
	// goroutine of its own, in order and coalesced: when it is slow, its
	// next call gets the latest leader, not every leader in between. It
	// never delays an election or a renew.
	OnNewLeader func(identity string)
	// OnLeaderValue is called, with values on (see Config.Value), with the
	// leader and its value whenever either changes as this elector learns
	// them: the leader's identity first with a nil Value, then its value
	// once the leader has written it, and again at each Proclaim. Identity
	// and Value always come from one read that paired them on the leader's
	// own session, so a value is never reported with another leader's
	// identity. It runs on a goroutine of its own, in order and coalesced,
	// like OnNewLeader.
	OnLeaderValue func(p leader.Proclamation)
}

// Config configures an Elector. Zero durations take the defaults.
type Config struct {
	// Connect opens the dedicated connection: DSN(...) or any Connector.
	Connect Connector
	// Key is the advisory lock that stands for leadership.
	Key leader.Key
	// Identity names this candidate; it becomes the connection's
	// application_name, followed by the rank of a ranked candidate
	// ("worker-1 [N0 1.8.0]", see leader.Rank). Default: hostname-pid. At
	// most 63 printable ASCII characters, rank included; it may not
	// itself end like a rank.
	Identity string
	// Callbacks; OnElected is required.
	Callbacks Callbacks
	// Logger receives structured logs; nil means none.
	Logger *zap.Logger
	// Observer receives events for metrics (promleader.NewMetrics, in the
	// module github.com/pgleader/pgleader/contrib/promleader); nil
	// means none. Its methods run on the elector's goroutine and must not
	// block.
	Observer leader.Observer

	// RenewInterval is how often the leader checks that it holds the lock
	// (and, for a follower whose role cannot create its session functions,
	// how long its lock wait lasts before it starts a new campaign round).
	// Default 1s.
	RenewInterval time.Duration
	// RenewDeadline is the trust window: the leader steps down when no
	// renew has succeeded within RenewDeadline of when the last successful
	// one was sent. Default 3s.
	RenewDeadline time.Duration
	// LeaseDuration is the server-side lease: the session's
	// idle_session_timeout (PostgreSQL 14+), after which the server ends a
	// silent leader's session and frees the lock. It is also how long an
	// heir's lock wait lasts (under deadlock_timeout while the server's
	// log_lock_waits is on) and how often a watcher polls. Default 6s.
	LeaseDuration time.Duration
	// ReleaseTimeout bounds how long a gracefully stepping-down leader (a
	// Resign, Run's context ending, OnElected returning) keeps the lock
	// while it waits for OnElected to return. It keeps renewing the lock
	// meanwhile, so any value is safe against LeaseDuration; past
	// ReleaseTimeout it releases the lock anyway and logs an error, since
	// two leaders may then act at once. Set it above the longest drain of
	// your OnElected. After a fault (the lock or the connection is lost) it
	// only bounds how long OnDemoted waits for OnElected. Default 5s.
	ReleaseTimeout time.Duration
	// ReconnectMaxDelay caps the exponential, jittered backoff between
	// reconnect attempts. Default 500ms.
	ReconnectMaxDelay time.Duration

	// Fencing turns on fencing terms: each election installs the next term
	// of Key in a table, and OnElected's Leadership carries it. Off by
	// default.
	Fencing Fencing

	// Value is this candidate's value, which it proclaims as it is
	// elected (etcd's Campaign value, Consul's lock value): where it
	// serves, for example, so that the others can route to the leader.
	// Followers read it (LeaderValue, Callbacks.OnLeaderValue), and so do
	// ObserveValues, leader.HolderValue and pgleader status. At most
	// leader.MaxValueSize bytes. A non-nil Value turns values on; see
	// Values for the table that holds them. Proclaim changes it without a
	// new election.
	Value []byte
	// Values configures the values table, and turns values on for a
	// candidate with no Value of its own (Enabled).
	Values Values

	// ResignRequests decides who may ask this elector, while it leads, to
	// hand over (RequestResign, pgleader resign). By default a superuser
	// and any member of the elector's own role may.
	ResignRequests ResignRequests

	// Priority, Version and Strategy rank this candidate (see
	// leader.Compare and docs/rolling-upgrades.md): a leader that sees a
	// candidate it prefers to itself standing for PreferredDelay hands
	// over to it, gracefully (OnElected returns before the unlock); a
	// leader that leaves hands over to the candidate it prefers most. A
	// tie keeps the leader. Every candidate of a key should use the same
	// Strategy. A ranked candidate's session carries its rank in its
	// application_name, where every session sees it; it tells each new
	// leader its rank with one notification, and again (backing off to
	// 30 s) only while the leader prefers it. A rank is believed only
	// from a session of the leader's own login role that stands for the
	// key and carries that rank. Nothing is sent while every candidate is
	// unranked (Priority 0, no Version, the default).
	Priority int
	// Version is this candidate's semantic version ("1.4.2"), compared
	// under NewestVersion and OldestVersion. At most 64 bytes.
	Version string
	// Strategy: leader.ByPriority (the default), leader.NewestVersion or
	// leader.OldestVersion.
	Strategy leader.Strategy
	// PreferredDelay is how long a preferred candidate must stand before
	// the leader hands over to it, counted from the later of its
	// election and the candidate's rank reaching it: a candidate that
	// flaps does not churn leadership, and a new leader's OnElected has
	// that long to start. Default 3 × RenewInterval.
	PreferredDelay time.Duration
}

// ResignRequests decides who may ask a leader to hand over from outside
// its process (see RequestResign). The leader reads the asker's role from
// pg_stat_activity by the backend pid the server stamps on the request,
// which no client can forge.
type ResignRequests struct {
	// Disabled refuses every request (the asker is told so).
	Disabled bool
	// Roles also allows members of these roles, besides superusers and
	// members of the elector's own role (its session_user).
	Roles []string
}

// Values configures the table of leaders' values (see Config.Value): a
// row per key, written by its leader in a round trip that proves it holds
// the lock, stamped with the leader's backend pid, session start and
// identity. Readers pair the row with the live holder in pg_locks on all
// three, so a value an earlier leader wrote is never read as a later
// leader's.
type Values struct {
	// Enabled turns values on without a Value of this candidate's own: it
	// reads the leader's, and may Proclaim one once it leads. A non-nil
	// Config.Value turns them on too.
	Enabled bool
	// Table is the values table, "name" or "schema.name" (raw names, as
	// Fencing.Table). Default leader.DefaultValuesTable.
	Table string
	// NoCreate makes a missing table an error instead of creating it
	// (create it with leader.ValuesTableSQL).
	NoCreate bool
	// TrustedOwner names a role whose values table is used although the
	// elector's role is not a member of it (see Fencing.TrustedOwner: the
	// owner of the table could write any value for any leader).
	TrustedOwner string
}

// Fencing configures fencing terms (see leader.Fence).
type Fencing struct {
	// Enabled turns fencing on. The elector then creates the terms table
	// when it is missing, unless NoCreate is set.
	Enabled bool
	// Table is the terms table, "name" or "schema.name". Default
	// leader.DefaultTermsTable. The parts are raw names, not SQL: pgleader
	// quotes each one, so "MyTerms" names the table MyTerms (case kept), and
	// a name written with SQL quotes, `"t"`, keeps its quote characters.
	Table string
	// NoCreate makes a missing table an error (leader.ErrNoTermsTable)
	// instead of creating it; for roles without CREATE privilege. Create it
	// with leader.TermsTableSQL (and the history table with
	// leader.HistoryTableSQL; without it the elector warns and keeps no
	// history).
	NoCreate bool
	// TrustedOwner names a role whose terms and history tables the
	// elector uses although its own role is not a member of it. By
	// default a table is used only when its owner is the elector's role, a
	// role it is a member of, or a superuser; any other owner's table is
	// refused (leader.ErrForeignTable), since its owner can rewrite the
	// terms, and on a shared database another role may create the table
	// first. A table a migration role creates for the application needs
	// that role here.
	TrustedOwner string

	// History: with fencing on, each term also gets a row in HistoryTable
	// (default leader.DefaultHistoryTable): key, term, identity, backend
	// pid, elected at, and, when the leader could still say so, demoted
	// at and why. It is written in the round trip that installs the term;
	// the end of a term is written after the unlock (or, after a fault,
	// when the elector connects again), off the handover's path. NoHistory
	// turns it off.
	NoHistory    bool
	HistoryTable string
	// HistoryRetention: rows older than this are deleted, a few at every
	// election. Default 30 days.
	HistoryRetention time.Duration
}

func (c *Config) setDefaults() {
	d := c.durations()
	d.SetDefaults()
	c.RenewInterval, c.RenewDeadline, c.LeaseDuration, c.ReleaseTimeout, c.ReconnectMaxDelay =
		d.RenewInterval, d.RenewDeadline, d.LeaseDuration, d.ReleaseTimeout, d.ReconnectMaxDelay
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Fencing.Enabled && c.Fencing.Table == "" {
		c.Fencing.Table = leader.DefaultTermsTable
	}
	if c.Fencing.HistoryTable == "" {
		c.Fencing.HistoryTable = leader.DefaultHistoryTable
	}
	def(&c.Fencing.HistoryRetention, DefaultHistoryRetention)
	def(&c.PreferredDelay, 3*c.RenewInterval)
	if c.Value != nil {
		c.Values.Enabled = true
	}
	if c.Values.Table == "" {
		c.Values.Table = leader.DefaultValuesTable
	}
	if c.Identity == "" {
		c.Identity = leader.DefaultIdentity()
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Observer == nil {
		c.Observer = leader.NopObserver{}
	}
}

// durations are c's timings, as the Elector and the Group share them.
func (c *Config) durations() timing.Durations {
	return timing.Durations{RenewInterval: c.RenewInterval, RenewDeadline: c.RenewDeadline, LeaseDuration: c.LeaseDuration,
		ReleaseTimeout: c.ReleaseTimeout, ReconnectMaxDelay: c.ReconnectMaxDelay}
}

func (c *Config) validate() error {
	bad := func(field, rule string, args ...any) error {
		return &ConfigError{Field: field, Rule: fmt.Sprintf(rule, args...)}
	}
	switch {
	case c.Connect == nil:
		return bad("Connect", "required (use elector.DSN(...) or a ConnectFunc)")
	case !c.Key.Valid():
		return bad("Key", "must be a valid key (leader.KeyFromName with a non-empty UTF-8 name, leader.Int64Key or leader.PairKey)")
	case c.Callbacks.OnElected == nil:
		return bad("Callbacks.OnElected", "required")
	case len(c.Identity) > maxIdentityLen:
		return bad("Identity", "must be at most %d bytes (PostgreSQL cuts application_name), got %d", maxIdentityLen, len(c.Identity))
	}
	if err := c.durations().Validate(); err != nil {
		return err
	}
	if err := timing.Printable(c.Identity, maxIdentityLen); err != nil {
		return bad("Identity", "%v (PostgreSQL replaces other characters in application_name)", err)
	}
	if c.Fencing.Enabled {
		if _, err := terms.Quote(c.Fencing.Table); err != nil {
			return bad("Fencing.Table", "%v", err)
		}
		if _, err := terms.Quote(c.Fencing.HistoryTable); err != nil {
			return bad("Fencing.HistoryTable", "%v", err)
		}
		if c.Fencing.HistoryRetention < time.Second {
			return bad("Fencing.HistoryRetention", "must be at least 1s, got %s", c.Fencing.HistoryRetention)
		}
	}
	if len(c.Value) > leader.MaxValueSize {
		return bad("Value", "must be at most %d bytes, got %d (keep a larger payload in a table of your own, and its key in the value)", leader.MaxValueSize, len(c.Value))
	}
	if _, err := terms.Quote(c.Values.Table); err != nil {
		return bad("Values.Table", "%v", err)
	}
	if err := leader.ConnectorError(c.Connect); err != nil {
		return &ConfigError{Field: "Connect", Rule: err.Error()}
	}
	return c.validateRank()
}

// validateRank checks Priority, Version, Strategy and PreferredDelay.
func (c *Config) validateRank() error {
	bad := func(field, rule string, args ...any) error {
		return &ConfigError{Field: field, Rule: fmt.Sprintf(rule, args...)}
	}
	switch {
	case c.Strategy < leader.ByPriority || c.Strategy > leader.OldestVersion:
		return bad("Strategy", "must be leader.ByPriority, leader.NewestVersion or leader.OldestVersion, got %d", int(c.Strategy))
	case c.Strategy != leader.ByPriority && c.Version == "":
		return bad("Version", "required with Strategy %s", c.Strategy)
	case len(c.Version) > lockconn.MaxRankVersion:
		return bad("Version", "must be at most %d bytes, got %d", lockconn.MaxRankVersion, len(c.Version))
	case c.PreferredDelay < 0:
		return bad("PreferredDelay", "must not be negative, got %s", c.PreferredDelay)
	}
	if c.Version != "" {
		if err := leader.ValidVersion(c.Version); err != nil {
			return bad("Version", "%v", err)
		}
	}
	if _, _, ok := leader.ParseApplicationName(c.Identity); ok {
		return bad("Identity", "must not end like a candidate's rank (%q): ranked candidates' application_names do", " [P0]")
	}
	if app := c.appName(); len(app) > maxIdentityLen {
		return bad("Identity", "with the candidate's rank, its application_name %q is %d bytes; PostgreSQL keeps %d: shorten Identity or Version", app, len(app), maxIdentityLen)
	}
	return nil
}

// appName is the application_name of this candidate's session: Identity,
// then the rank when it has one (see leader.Rank), which every session
// that sees the candidate's locks can read.
func (c *Config) appName() string {
	if !c.ranked() {
		return c.Identity
	}
	return leader.Rank{Strategy: c.Strategy, Preference: c.preference()}.ApplicationName(c.Identity)
}

// ranked reports whether this candidate tells leaders its rank: anything
// but the default rank.
func (c *Config) ranked() bool { return c.Priority != 0 || c.Version != "" }

// preference is this candidate's rank.
func (c *Config) preference() leader.Preference {
	return leader.Preference{Priority: c.Priority, Version: c.Version}
}
