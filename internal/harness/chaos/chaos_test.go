package chaos

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgleader/pgleader/internal/testpg"
)

var (
	duration = flag.Duration("chaos.duration", 40*time.Second, "how long TestChaos injects faults")
	seed     = flag.Int64("chaos.seed", 0, "schedule seed (0: time-based)")
	groupDur = flag.Duration("chaos.group-duration", 20*time.Second, "how long TestChaosGroup injects faults")
	keys     = flag.Int("chaos.keys", 100, "keys of TestChaosGroup's group")
	members  = flag.Int("chaos.members", 3, "members of TestChaosGroup's group (plus one that reaches only the standby)")
	hostile  = flag.Duration("chaos.hostile-duration", 20*time.Second, "how long TestChaosHostile and TestChaosGroupHostile inject faults")
	ranked   = flag.Duration("chaos.ranked-duration", 20*time.Second, "how long TestChaosRanked injects faults")
)

func TestMain(m *testing.M) {
	if role := os.Getenv(testpg.ChildEnv); role != "" {
		os.Exit(ChildMain(role))
	}
	goleak.VerifyTestMain(m)
}

// runChecked runs cfg with the -chaos.seed seed (time-based when 0), logs
// the summary, and fails the test on any violation.
func runChecked(t *testing.T, cfg Config) *Report {
	t.Helper()
	cfg.Seed = *seed
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano() % 1_000_000
	}
	r := Run(t, cfg)
	t.Log("\n" + r.Summary())
	if !r.OK() {
		t.Fatalf("chaos found violations (seed %d):\n%s", cfg.Seed, r.Summary())
	}
	return r
}

// TestChaos runs the seeded fault schedule against 5 elector processes and
// checks every invariant. A short run is part of go test ./...; run it
// longer with -chaos.duration=30m -chaos.seed=N.
func TestChaos(t *testing.T) {
	r := runChecked(t, Config{Duration: *duration, Failover: true})
	if r.Tenures < 3 {
		t.Fatalf("only %d tenures: the schedule did not exercise failover", r.Tenures)
	}
}

// TestChaosGroup runs the same schedule against the members of one
// group.Group with 100 keys, and checks every invariant per key: safety,
// fencing terms and fenced writes, callback pairs, slow drains, the
// standby; liveness means every key led again.
func TestChaosGroup(t *testing.T) {
	r := runChecked(t, Config{Duration: *groupDur, Failover: true, Group: true, Keys: *keys, Electors: *members})
	if r.Tenures < 2**keys {
		t.Fatalf("only %d tenures for %d keys: the schedule did not move keys", r.Tenures, *keys)
	}
}

// TestChaosHostile runs the schedule beside a hostile tenant (see
// hostile.go): the electors' role has a shadowed search_path, and another
// role forges notifications, squats pgleader's locks and fills the lock
// table. Every invariant must hold, and no elector may be told of a
// leader that is not one of them.
func TestChaosHostile(t *testing.T) {
	r := runChecked(t, Config{Duration: *hostile, Failover: true, Hostile: true})
	if r.Hostile["notifications"] == 0 {
		t.Fatalf("the hostile tenant sent nothing: %v", r.Hostile)
	}
}

// TestChaosRanked is TestChaos with ranked electors (priorities 0, 1, 2):
// preference handovers, and leaving leaders' handovers to the best
// candidate, happen among the faults, and every check still holds.
func TestChaosRanked(t *testing.T) {
	r := runChecked(t, Config{Duration: *ranked, Failover: true, Ranked: true})
	if r.Tenures < 3 {
		t.Fatalf("only %d tenures: the schedule did not exercise failover", r.Tenures)
	}
}

// TestChaosGroupHostile is TestChaosHostile for the members of a group.
func TestChaosGroupHostile(t *testing.T) {
	r := runChecked(t, Config{Duration: *hostile, Failover: true, Group: true, Keys: *keys, Electors: *members, Hostile: true})
	if r.Hostile["notifications"] == 0 {
		t.Fatalf("the hostile tenant sent nothing: %v", r.Hostile)
	}
}

// The checker must be able to fail: with an elector that never checks its
// lock, a backend kill lets a real elector take over while the broken one
// still believes it leads and writes with its stale term.
func TestCheckerCatchesBrokenElector(t *testing.T) {
	r := Run(t, Config{Seed: 1, Duration: 6 * time.Second, Electors: 2, Broken: 1, Faults: []string{"terminate"}})
	t.Log("\n" + r.Summary())
	if r.OK() {
		t.Fatal("the checker passed a broken elector")
	}
	safety, fencing := false, false
	for _, v := range r.Violations {
		safety = safety || len(v) > 6 && v[:6] == "safety"
		fencing = fencing || len(v) > 7 && v[:7] == "fencing"
	}
	if !safety || !fencing {
		t.Fatalf("want safety and fencing violations, got:\n%s", fmt.Sprint(r.Violations))
	}
}

// The group mode's checker must be able to fail too: a member that takes
// keys once and never checks them keeps "leading" them after its session
// is terminated, while real members take them over, and it writes with its
// stale terms.
func TestCheckerCatchesBrokenGroupMember(t *testing.T) {
	r := Run(t, Config{Seed: 1, Duration: 6 * time.Second, Electors: 2, Broken: 1, Faults: []string{"terminate"}, Group: true, Keys: 10})
	t.Log("\n" + r.Summary())
	if r.OK() {
		t.Fatal("the checker passed a broken group member")
	}
	safety, fencing := false, false
	for _, v := range r.Violations {
		safety = safety || strings.HasPrefix(v, "safety")
		fencing = fencing || strings.HasPrefix(v, "fencing")
	}
	if !safety || !fencing {
		t.Fatalf("want safety and fencing violations, got:\n%s", fmt.Sprint(r.Violations))
	}
}
