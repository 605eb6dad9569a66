package pgtemp

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A connection opened into a black hole does not reach the target (a
// server would keep a backend waiting for its startup packet, and a fast
// shutdown would wait for that backend); Heal closes it, and a new one is
// forwarded.
func TestProxyBlackholeHoldsNewConnections(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	p, err := NewProxy(target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Blackhole()
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	held.Write([]byte("startup"))
	// The proxy answers nothing while the hole lasts.
	held.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := held.Read(make([]byte, 1)); n != 0 || !isTimeout(err) {
		t.Fatalf("a read through the black hole: %d bytes, %v; want a timeout", n, err)
	}
	p.Heal()
	held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a connection opened into the black hole, after Heal: %v; want it closed", err)
	}
	select {
	case c := <-accepted:
		c.Close()
		t.Fatal("a connection opened into the black hole reached the target")
	default:
	}
	fresh, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("a connection after Heal did not reach the target")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
