package leader_test

import (
	"fmt"

	"github.com/pgleader/pgleader/leader"
)

// A named key is stable, and its pg_locks columns are known in advance.
func ExampleKeyFromName() {
	k := leader.KeyFromName("billing-consumer")
	v, _ := k.Int64()
	classid, objid, objsubid := k.LockTag()
	fmt.Println(v)
	fmt.Println(classid, objid, objsubid)
	// Output:
	// 6869070981396482805
	// 1599330217 3876899573 1
}

// Pair keys keep namespaces apart: confirming and refunding order 7 are
// different locks.
func ExamplePairKey() {
	const confirm, refund = 1, 2
	fmt.Println(leader.PairKey(confirm, 7), leader.PairKey(refund, 7), leader.PairKey(confirm, 7) == leader.PairKey(refund, 7))
	// Output: 1:7 2:7 false
}
