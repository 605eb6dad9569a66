package leader

import "time"

// Leadership describes one tenure: the election of Identity as the holder of
// Key. It is handed to OnElected and OnDemoted.
type Leadership struct {
	// Key is the advisory lock held.
	Key Key
	// Identity is the elector's identity, also its application_name.
	Identity string
	// Term is the fencing token of this tenure: strictly greater than the
	// term of every earlier tenure of Key. It is 0 when fencing is off.
	Term int64
	// TermsTable is the table that holds Term ("" when fencing is off).
	// Leadership.Fence uses it.
	TermsTable string
	// ElectedAt is when the lock was granted, on this process's clock.
	ElectedAt time.Time
	// BackendPID is the server process that holds the lock.
	BackendPID uint32
}
