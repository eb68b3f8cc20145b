package logging

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	slogmulti "github.com/samber/slog-multi"
)

// Redacted replaces every registered secret value and stands for nothing else.
const Redacted = "[REDACTED]"

// MinSecretLen is the shortest value Add accepts. Shorter values would match
// ordinary words, numbers and ids and shred the log without protecting much.
const MinSecretLen = 6

// Redactor holds the secret values known at run time (tokens, dispatch
// secrets, credential values). Values are reference counted: two components
// may register the same credential, and one Remove must not expose it while
// the other still holds it. The zero value is ready to use; a nil *Redactor
// drops secret keys only.
type Redactor struct {
	mu     sync.Mutex
	counts map[string]int
	// set is rebuilt on every change and read without a lock, so logging never
	// waits for a registration.
	set atomic.Pointer[secretSet]
}

// NewRedactor returns a Redactor that already knows values.
func NewRedactor(values ...string) *Redactor {
	r := &Redactor{}
	r.Add(values...)
	return r
}

// Add registers secret values; values shorter than MinSecretLen are ignored.
func (r *Redactor) Add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	changed := false
	for _, v := range values {
		if len(v) < MinSecretLen {
			continue
		}
		r.counts[v]++
		changed = changed || r.counts[v] == 1
	}
	if changed {
		r.rebuild()
	}
}

// Remove drops one registration of each value; a value registered twice stays
// redacted until it is removed twice.
func (r *Redactor) Remove(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for _, v := range values {
		n, ok := r.counts[v]
		if !ok {
			continue
		}
		if n <= 1 {
			delete(r.counts, v)
			changed = true
		} else {
			r.counts[v] = n - 1
		}
	}
	if changed {
		r.rebuild()
	}
}

// Len is the number of distinct values held.
func (r *Redactor) Len() int {
	return len(r.load().values)
}

// String returns s with every registered value replaced by Redacted.
func (r *Redactor) String(s string) string {
	return r.load().redact(s)
}

func (r *Redactor) rebuild() {
	vs := make([]string, 0, len(r.counts))
	for v := range r.counts {
		vs = append(vs, v)
	}
	// Longest first so a value that contains another is matched whole.
	slices.SortFunc(vs, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(b), len(a)), strings.Compare(a, b))
	})
	r.set.Store(&secretSet{values: vs})
}

var noSecrets = &secretSet{}

func (r *Redactor) load() *secretSet {
	if r == nil {
		return noSecrets
	}
	if s := r.set.Load(); s != nil {
		return s
	}
	return noSecrets
}

// IsSecretKey reports whether an attribute with this key is dropped whatever
// its value: secret, token, authorization, password, credentials_values and
// any key ending in _secret or _token (case-insensitive, '-' read as '_').
func IsSecretKey(key string) bool {
	k := strings.ReplaceAll(strings.ToLower(key), "-", "_")
	switch k {
	case "secret", "token", "authorization", "password", "credentials_values":
		return true
	}
	return strings.HasSuffix(k, "_secret") || strings.HasSuffix(k, "_token")
}

// secretSet is an immutable snapshot of the registered values.
type secretSet struct {
	values []string
}

// redact marks every occurrence of every value (overlaps included) and
// replaces each merged span once, so no fragment of a value survives next to
// another.
func (s *secretSet) redact(in string) string {
	if len(s.values) == 0 || len(in) < MinSecretLen {
		return in
	}
	var spans [][2]int
	for _, v := range s.values {
		for off := 0; off+len(v) <= len(in); {
			i := strings.Index(in[off:], v)
			if i < 0 {
				break
			}
			spans = append(spans, [2]int{off + i, off + i + len(v)})
			off += i + 1
		}
	}
	if len(spans) == 0 {
		return in
	}
	slices.SortFunc(spans, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
	var b strings.Builder
	b.Grow(len(in))
	pos := 0
	for i := 0; i < len(spans); {
		start, end := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] <= end; i++ {
			end = max(end, spans[i][1])
		}
		b.WriteString(in[pos:start])
		b.WriteString(Redacted)
		pos = end
	}
	b.WriteString(in[pos:])
	return b.String()
}

// attrs returns the redacted copy of as: secret keys dropped, values resolved
// and scrubbed, groups recursed.
func (s *secretSet) attrs(as []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, 0, len(as))
	for _, a := range as {
		if a.Key != "" && IsSecretKey(a.Key) {
			continue
		}
		v := a.Value.Resolve()
		switch v.Kind() {
		case slog.KindString:
			v = slog.StringValue(s.redact(v.String()))
		case slog.KindGroup:
			v = slog.GroupValue(s.attrs(v.Group())...)
		case slog.KindAny:
			// Rendered here rather than by the sink: a sink might marshal
			// fields that String() hides, or base64 a []byte, and either
			// would carry a secret past a substring check.
			v = slog.StringValue(s.redact(render(v.Any())))
		}
		out = append(out, slog.Attr{Key: s.redact(a.Key), Value: v})
	}
	return out
}

func render(x any) string {
	if b, ok := x.([]byte); ok {
		return string(b)
	}
	return fmt.Sprintf("%+v", x)
}

// Middleware returns the redaction step as a slog-multi middleware, to put in
// front of any sink: slogmulti.Pipe(r.Middleware()).Handler(sink).
func (r *Redactor) Middleware() slogmulti.Middleware {
	return func(next slog.Handler) slog.Handler {
		return &redactHandler{next: next, r: r}
	}
}

// redactHandler keeps With attributes and groups itself instead of handing
// them to next: a value registered after logger.With(...) must still be
// removed, so the scrub happens when a record is handled, never earlier.
type redactHandler struct {
	next slog.Handler
	r    *Redactor
	ops  []withOp
}

// withOp is one WithGroup (group != "") or one WithAttrs call.
type withOp struct {
	group string
	attrs []slog.Attr
}

func (h *redactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *redactHandler) with(op withOp) *redactHandler {
	return &redactHandler{next: h.next, r: h.r, ops: append(slices.Clip(h.ops), op)}
}

func (h *redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	return h.with(withOp{attrs: slices.Clone(as)})
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(withOp{group: name})
}

func (h *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	set := h.r.load()
	cur := make([]slog.Attr, 0, rec.NumAttrs())
	rec.Attrs(func(a slog.Attr) bool {
		cur = append(cur, a)
		return true
	})
	cur = set.attrs(cur)
	// Rebuild the nesting the With calls described, innermost first; an empty
	// group is omitted by every sink, as it would have been without us.
	for i := len(h.ops) - 1; i >= 0; i-- {
		op := h.ops[i]
		if op.group != "" {
			cur = []slog.Attr{{Key: set.redact(op.group), Value: slog.GroupValue(cur...)}}
			continue
		}
		cur = append(set.attrs(op.attrs), cur...)
	}
	out := slog.NewRecord(rec.Time, rec.Level, set.redact(rec.Message), rec.PC)
	out.AddAttrs(cur...)
	return h.next.Handle(ctx, out)
}
