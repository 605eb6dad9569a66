package pgtemp

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a loopback TCP proxy in front of a server. It injects network
// faults into the connections that go through it: Cut closes them at once,
// and Blackhole stops forwarding in both directions while every socket stays
// open, which is what a network partition looks like to both ends.
type Proxy struct {
	ln     net.Listener
	target string

	// Counters of forwarded traffic: bytes and reads (about one per
	// message batch) from client to server and back.
	BytesUp, BytesDown, ReadsUp, ReadsDown atomic.Int64

	// replyDelay (ns) holds back every chunk from the server this long.
	replyDelay atomic.Int64

	mu        sync.Mutex
	pairs     map[*pair]struct{}
	blackhole bool
	parked    []net.Conn // clients that connected into the black hole
	closed    bool
	wg        sync.WaitGroup
}

type pair struct {
	client, server net.Conn
	mu             sync.Mutex
	holed          bool
	once           sync.Once
}

func (p *pair) isHoled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed
}

func (p *pair) close() {
	p.once.Do(func() {
		p.client.Close()
		p.server.Close()
	})
}

// NewProxy starts a proxy on a free loopback port that forwards to target
// (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns a superuser connection string that goes through the proxy.
func (p *Proxy) DSN() string { return DSNFor(p.Addr()) }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		// A connection opened into a black hole never reaches the
		// server: it is held open, silent, until the hole heals. Dialled
		// through, it would leave the server a backend waiting for a
		// startup packet that never comes, for authentication_timeout
		// (60 s), and a fast shutdown waits for it.
		p.mu.Lock()
		if p.blackhole && !p.closed {
			p.parked = append(p.parked, c)
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			return
		}
		pr.holed = p.blackhole
		p.pairs[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(pr, c, s, &p.BytesUp, &p.ReadsUp)
		go p.pipe(pr, s, c, &p.BytesDown, &p.ReadsDown)
	}
}

// pipe copies src to dst until an error. While the pair is black-holed it
// reads and drops, and an error on one side is not passed on to the other:
// the far end must not learn anything. What the server sends goes through
// a queue (see delayed), so that a reply delay is a latency, not a limit
// on throughput.
func (p *Proxy) pipe(pr *pair, src, dst net.Conn, bytes, reads *atomic.Int64) {
	defer p.wg.Done()
	forward := func(b []byte) error {
		if pr.isHoled() {
			return nil
		}
		bytes.Add(int64(len(b)))
		reads.Add(1)
		_, err := dst.Write(b)
		return err
	}
	var q chan chunk
	if src == pr.server {
		q = make(chan chunk, 1<<12)
		done := make(chan struct{})
		go p.delayed(pr, q, forward, done)
		defer func() { close(q); <-done }()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			switch {
			case q != nil:
				q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.replyDelay.Load()))}
			default:
				if werr := forward(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			p.end(pr)
			return
		}
	}
}

// chunk is what the server sent, and when to pass it on.
type chunk struct {
	b   []byte
	due time.Time
}

// delayed passes the server's chunks on in order, each at its due time:
// a chunk read while earlier ones wait is not held back behind them.
func (p *Proxy) delayed(pr *pair, q <-chan chunk, forward func([]byte) error, done chan<- struct{}) {
	defer close(done)
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if err := forward(c.b); err != nil {
			p.end(pr)
		}
	}
}

// end closes a pair after an error, unless it is black-holed (its far
// ends must not learn of it).
func (p *Proxy) end(pr *pair) {
	if !pr.isHoled() {
		pr.close()
		p.forget(pr)
	}
}

// DelayReplies holds back everything the server sends, on every
// connection, by d before passing it on (0 ends it): a slow path on which a
// reply arrives well after its request was sent.
func (p *Proxy) DelayReplies(d time.Duration) { p.replyDelay.Store(int64(d)) }

func (p *Proxy) forget(pr *pair) {
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// Cut closes every connection through the proxy at once. New connections
// are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	prs := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		prs = append(prs, pr)
	}
	p.pairs = map[*pair]struct{}{}
	parked := p.unpark()
	p.mu.Unlock()
	for _, pr := range prs {
		pr.close()
	}
	closeAll(parked)
}

// unpark takes the clients parked in the black hole; p.mu is held.
func (p *Proxy) unpark() []net.Conn {
	parked := p.parked
	p.parked = nil
	return parked
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// Blackhole stops forwarding on every connection, current and new, in both
// directions, and keeps the sockets open. Heal ends it.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = true
	for pr := range p.pairs {
		pr.mu.Lock()
		pr.holed = true
		pr.mu.Unlock()
	}
}

// Heal ends a black-hole: the black-holed connections are closed (their
// streams lost bytes and cannot resume), and so are those opened into the
// hole (a client then connects again), and new connections are forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.blackhole = false
	var holed []*pair
	for pr := range p.pairs {
		if pr.isHoled() {
			holed = append(holed, pr)
			delete(p.pairs, pr)
		}
	}
	parked := p.unpark()
	p.mu.Unlock()
	for _, pr := range holed {
		pr.close()
	}
	closeAll(parked)
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	prs := p.pairs
	p.pairs = map[*pair]struct{}{}
	parked := p.unpark()
	p.mu.Unlock()
	p.ln.Close()
	closeAll(parked)
	for pr := range prs {
		pr.close()
	}
	p.wg.Wait()
}
