package fleet

import (
	"encoding/json"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// Mono returns CLOCK_MONOTONIC in nanoseconds. Every process on the machine
// shares this clock, so events of a child and its parent can be ordered.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// Event is one line a child writes on its stdout, as JSON.
type Event struct {
	Ev       string `json:"ev"`
	Mono     int64  `json:"mono"`
	Identity string `json:"id,omitempty"`
	Term     int64  `json:"term,omitempty"`
	Err      string `json:"err,omitempty"`
	Data     string `json:"data,omitempty"`
}

// Emitter writes Events from inside a child. It is safe for concurrent use.
type Emitter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewEmitter returns an Emitter writing to w (a child's os.Stdout).
func NewEmitter(w io.Writer) *Emitter { return &Emitter{w: w} }

// Emit stamps e with Mono() when unset and writes it as one JSON line.
func (m *Emitter) Emit(e Event) {
	if e.Mono == 0 {
		e.Mono = Mono()
	}
	b, _ := json.Marshal(e)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.w.Write(append(b, '\n'))
}
