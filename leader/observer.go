package leader

import (
	"errors"
	"time"
)

// Observer receives events from electors and lock helpers, for metrics. Its
// methods are called on the caller's goroutine and must return quickly.
// Embed NopObserver to implement only some of them and to stay compatible
// when methods are added. health.Metrics implements it for Prometheus.
type Observer interface {
	// Campaigning: an elector with this key started campaigning (after it
	// started, reconnected or stepped down).
	Campaigning(key Key, identity string)
	// LockWaited: a lock was waited for, from the start of the wait (an
	// elector's campaign, a one-shot lock call) until it was granted or the
	// attempt ended.
	LockWaited(key Key, wait time.Duration, acquired bool)
	// Elected: a tenure began.
	Elected(l Leadership)
	// Renewed: a leader's renew succeeded, taking latency.
	Renewed(l Leadership, latency time.Duration)
	// Demoted: a tenure ended, for reason. It is called as the step-down
	// begins, before OnElected has returned and OnDemoted runs, so reason
	// is why the step-down began: a graceful one (a resign, say) that then
	// loses its session while OnElected returns gives OnDemoted that fault
	// instead, after this call.
	Demoted(l Leadership, reason error)
	// Reconnecting: a connection attempt failed or a connection was lost,
	// and the next attempt comes after delay.
	Reconnecting(key Key, identity string, attempt int, delay time.Duration, err error)
}

// NopObserver ignores every event.
type NopObserver struct{}

// Campaigning does nothing.
func (NopObserver) Campaigning(Key, string) {}

// LockWaited does nothing.
func (NopObserver) LockWaited(Key, time.Duration, bool) {}

// Elected does nothing.
func (NopObserver) Elected(Leadership) {}

// Renewed does nothing.
func (NopObserver) Renewed(Leadership, time.Duration) {}

// Demoted does nothing.
func (NopObserver) Demoted(Leadership, error) {}

// Reconnecting does nothing.
func (NopObserver) Reconnecting(Key, string, int, time.Duration, error) {}

// ReasonLabels are every label ReasonLabel gives a demotion's reason, for
// metrics that start each series at zero.
var ReasonLabels = []string{"connection_lost", "lock_lost", "renew_deadline", "resigned", "callback_returned",
	"transaction_pooling", "no_terms_table", "standby", "read_only", "rejected", "stopped", "other"}

// ReasonLabel names a demotion reason for metrics and logs:
// connection_lost, lock_lost, renew_deadline, resigned, callback_returned,
// transaction_pooling, no_terms_table, stopped (the context ended) or other.
func ReasonLabel(reason error) string {
	switch {
	case reason == nil:
		return "none"
	case errors.Is(reason, ErrConnectionLost):
		return "connection_lost"
	case errors.Is(reason, ErrLockLost):
		return "lock_lost"
	case errors.Is(reason, ErrRenewDeadline):
		return "renew_deadline"
	case errors.Is(reason, ErrResigned):
		return "resigned"
	case errors.Is(reason, ErrCallbackReturned):
		return "callback_returned"
	case errors.Is(reason, ErrTransactionPooling):
		return "transaction_pooling"
	case errors.Is(reason, ErrNoTermsTable):
		return "no_terms_table"
	case errors.Is(reason, ErrStandby):
		return "standby"
	case errors.Is(reason, ErrReadOnly):
		return "read_only"
	case errors.Is(reason, ErrRejected):
		return "rejected"
	case isContextErr(reason):
		return "stopped"
	default:
		return "other"
	}
}
