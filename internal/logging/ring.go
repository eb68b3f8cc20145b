package logging

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// DefaultRingSize bounds the recent-records ring when Config.RingSize is 0.
const DefaultRingSize = 500

// Record is one log record as the dashboard shows it: everything already
// rendered to text, so a page never formats a value the redaction step did
// not see.
type Record struct {
	// Seq increases by one per record kept, so a reader can ask for what is new.
	Seq     uint64
	Time    time.Time
	Level   string
	Message string
	Attrs   []Field
}

// Field is one attribute; keys inside groups are joined with '.'.
type Field struct {
	Key   string
	Value string
}

// Ring keeps the most recent records in memory. It is safe for concurrent use.
type Ring struct {
	mu   sync.Mutex
	buf  []Record
	next int
	full bool
	seq  uint64
	wake chan struct{}
}

// NewRing returns a ring that keeps size records (DefaultRingSize when size <= 0).
func NewRing(size int) *Ring {
	if size <= 0 {
		size = DefaultRingSize
	}
	return &Ring{buf: make([]Record, size)}
}

// Cap is how many records the ring keeps.
func (r *Ring) Cap() int { return len(r.buf) }

func (r *Ring) add(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	rec.Seq = r.seq
	r.buf[r.next] = rec
	r.next++
	if r.next == len(r.buf) {
		r.next = 0
		r.full = true
	}
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// Updated returns a channel closed when the next record is kept, so a live
// view (the dashboard's event stream) waits instead of polling.
func (r *Ring) Updated() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

// Recent returns up to n of the newest records, oldest first. n <= 0 means all.
func (r *Ring) Recent(n int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []Record
	if r.full {
		all = append(slices.Clone(r.buf[r.next:]), r.buf[:r.next]...)
	} else {
		all = slices.Clone(r.buf[:r.next])
	}
	if n > 0 && n < len(all) {
		all = all[len(all)-n:]
	}
	return all
}

// Since returns the records kept with Seq > seq, oldest first; records already
// overwritten are gone.
func (r *Ring) Since(seq uint64) []Record {
	all := r.Recent(0)
	i, _ := slices.BinarySearchFunc(all, seq+1, func(rec Record, s uint64) int {
		switch {
		case rec.Seq < s:
			return -1
		case rec.Seq > s:
			return 1
		}
		return 0
	})
	return all[i:]
}

// Handler returns a slog sink that stores records of level or above in r.
func (r *Ring) Handler(level slog.Leveler) slog.Handler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &ringHandler{ring: r, level: level}
}

type ringHandler struct {
	ring   *Ring
	level  slog.Leveler
	prefix string
	attrs  []Field
}

func (h *ringHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *ringHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clip(h.attrs)
	for _, a := range as {
		c.attrs = appendFields(c.attrs, h.prefix, a)
	}
	return &c
}

func (h *ringHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + name + "."
	return &c
}

func (h *ringHandler) Handle(_ context.Context, rec slog.Record) error {
	fs := slices.Clone(h.attrs)
	rec.Attrs(func(a slog.Attr) bool {
		fs = appendFields(fs, h.prefix, a)
		return true
	})
	h.ring.add(Record{Time: rec.Time, Level: rec.Level.String(), Message: rec.Message, Attrs: fs})
	return nil
}

func appendFields(fs []Field, prefix string, a slog.Attr) []Field {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p = prefix + a.Key + "."
		}
		for _, g := range v.Group() {
			fs = appendFields(fs, p, g)
		}
		return fs
	}
	if a.Key == "" {
		return fs
	}
	s := v.String()
	if v.Kind() == slog.KindTime {
		s = v.Time().Format(time.RFC3339Nano)
	} else if v.Kind() == slog.KindAny {
		s = render(v.Any())
	}
	return append(fs, Field{Key: prefix + a.Key, Value: s})
}
