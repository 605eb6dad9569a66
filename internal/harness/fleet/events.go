package fleet

import (
	"encoding/json"
	"io"
	"sync"

	"github.com/pgleader/pgleader/internal/harness/proc"
)

// Mono returns CLOCK_MONOTONIC in nanoseconds (see proc.Mono). Every
// process on the machine shares this clock, so events of a child and its
// parent can be ordered.
func Mono() int64 { return proc.Mono() }

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
