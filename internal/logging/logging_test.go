package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
)

const (
	credValue      = "cred-VALUE-4f1e2d3c"
	dispatchSecret = "9f86d081884c7d659a2feaa0c55ad015"
	bearerToken    = "jft_live_0123456789abcdef"
	lateSecret     = "late-registered-S3CR3T"
)

type hidingStringer struct{ Value string }

func (h hidingStringer) String() string { return "credential(" + h.Value + ")" }

type secretValuer struct{ v string }

func (s secretValuer) LogValue() slog.Value {
	return slog.GroupValue(slog.String("resolved", "from valuer "+s.v))
}

type payload struct {
	Name  string
	Value string
}

// logEverything sends the registered secrets through every kind of attribute
// a component might use, and values that only their key marks as secret.
func logEverything(lg *slog.Logger) {
	wrapped := fmt.Errorf("dispatch to agent: %w", fmt.Errorf("agent answered %q", dispatchSecret))
	lg = lg.With("agent_url", "https://agent:"+bearerToken+"@10.0.0.1", slog.Any("conn_err", wrapped))
	lg = lg.WithGroup("req").With("auth", "Bearer "+bearerToken)
	lg.Info("job_dispatched "+credValue,
		"job_id", "job-ordinary-0001",
		"detail", "env had "+credValue+" inside",
		slog.Any("err", errors.Join(errors.New("first"), errors.New("second "+credValue))),
		slog.Any("stringer", hidingStringer{Value: credValue}),
		slog.Any("list", []string{"plain", credValue}),
		slog.Any("map", map[string]string{"API_KEY": credValue}),
		slog.Any("bytes", []byte("raw "+dispatchSecret)),
		slog.Any("struct", payload{Name: "n", Value: dispatchSecret}),
		slog.Any("valuer", secretValuer{credValue}),
		slog.Group("nested", slog.String("inner", dispatchSecret), slog.Group("deeper", slog.Any("e", wrapped))),
		slog.String(credValue, "secret as a key"),
		// Dropped by key even though nobody registered the value.
		"token", "unregistered-token-aaaa",
		"dispatch_secret", "unregistered-secret-bbbb",
		"Authorization", "Basic unregistered-cccc",
		"api-token", "unregistered-dddd",
		"password", "unregistered-eeee",
		slog.Group("credentials_values", slog.String("X", "unregistered-ffff")),
		slog.Group("g", slog.String("session_token", "unregistered-gggg")),
	)
}

var leaks = []string{
	credValue, dispatchSecret, bearerToken,
	"unregistered-token-aaaa", "unregistered-secret-bbbb", "unregistered-cccc",
	"unregistered-dddd", "unregistered-eeee", "unregistered-ffff", "unregistered-gggg",
	"dispatch_secret", "credentials_values", "session_token", "Authorization", "api-token", "password",
}

func ringText(r *Ring) string {
	var b strings.Builder
	for _, rec := range r.Recent(0) {
		b.WriteString(rec.Message + "\n")
		for _, f := range rec.Attrs {
			b.WriteString(f.Key + "=" + f.Value + "\n")
		}
	}
	return b.String()
}

func TestRedactsEveryAttributeKind(t *testing.T) {
	for _, format := range []string{FormatJSON, FormatText} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			red := NewRedactor(credValue, dispatchSecret, bearerToken)
			lg, ring := New(Config{Format: format, Writer: &out}, red)
			logEverything(lg)

			for name, text := range map[string]string{"output": out.String(), "ring": ringText(ring)} {
				for _, s := range leaks {
					if strings.Contains(text, s) {
						t.Errorf("%s holds %q:\n%s", name, s, text)
					}
				}
				for _, want := range []string{"job_dispatched " + Redacted, "job-ordinary-0001",
					"env had " + Redacted + " inside", "credential(" + Redacted + ")", "plain",
					"secret as a key", "from valuer " + Redacted, "first"} {
					if !strings.Contains(text, want) {
						t.Errorf("%s lost ordinary text %q:\n%s", name, want, text)
					}
				}
			}
			if format != FormatJSON {
				return
			}
			var rec map[string]any
			if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
				t.Fatalf("output is not one JSON record: %v\n%s", err, out.String())
			}
			req := rec["req"].(map[string]any)
			if got := req["auth"]; got != "Bearer "+Redacted {
				t.Errorf("req.auth = %v", got)
			}
			if got := req["nested"].(map[string]any)["inner"]; got != Redacted {
				t.Errorf("req.nested.inner = %v", got)
			}
			if _, ok := req["g"]; ok {
				t.Errorf("group holding only a secret key was kept: %v", req["g"])
			}
		})
	}
}

func TestValueRegisteredAfterWithIsRedacted(t *testing.T) {
	var out bytes.Buffer
	red := NewRedactor()
	lg, ring := New(Config{Writer: &out}, red)
	child := lg.With("conn", "dsn://u:"+lateSecret+"@h").WithGroup("op")

	red.Add(lateSecret)
	child.Info("connected", "again", lateSecret)
	if strings.Contains(out.String(), lateSecret) || strings.Contains(ringText(ring), lateSecret) {
		t.Fatalf("value added after With leaked:\n%s", out.String())
	}

	red.Remove(lateSecret)
	out.Reset()
	child.Info("connected")
	if !strings.Contains(out.String(), lateSecret) {
		t.Fatalf("removed value still redacted, so the check above proves nothing:\n%s", out.String())
	}
}

func TestRedactorCountsRegistrations(t *testing.T) {
	r := NewRedactor()
	r.Add(lateSecret, lateSecret, "short")
	if r.Len() != 1 {
		t.Fatalf("Len = %d, want 1 (short value ignored, duplicate counted once)", r.Len())
	}
	if got := r.String("short"); got != "short" {
		t.Errorf("short value redacted: %q", got)
	}
	r.Remove(lateSecret)
	if got := r.String("x" + lateSecret); got != "x"+Redacted {
		t.Errorf("after one of two removes: %q", got)
	}
	r.Remove(lateSecret)
	if got := r.String("x" + lateSecret); got != "x"+lateSecret {
		t.Errorf("after both removes: %q", got)
	}
}

func TestOverlappingValuesLeaveNoFragment(t *testing.T) {
	r := NewRedactor("abcdefgh", "efghijkl", "aaaaaa")
	for in, want := range map[string]string{
		"xxabcdefghijklyy":  "xx" + Redacted + "yy",
		"aaaaaaa and abcd":  Redacted + " and abcd",
		"abcdefghabcdefgh":  Redacted,
		"nothing to see":    "nothing to see",
		"efghijkl-abcdefgh": Redacted + "-" + Redacted,
	} {
		if got := r.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSecretKeys(t *testing.T) {
	for key, want := range map[string]bool{
		"secret": true, "token": true, "Authorization": true, "password": true,
		"credentials_values": true, "dispatch_secret": true, "api_token": true, "X-Auth-Token": true,
		"job_id": false, "tokens_file": false, "token_count": false, "secret_hash": false, "credentials": false,
	} {
		if got := IsSecretKey(key); got != want {
			t.Errorf("IsSecretKey(%q) = %v, want %v", key, got, want)
		}
	}
}

var timeField = regexp.MustCompile(`"time":"[^"]*",`)

// With no secrets the pipeline must write exactly what slog's own handler
// writes: the redaction step rebuilds With/WithGroup nesting itself.
func TestNestingMatchesSlog(t *testing.T) {
	cases := map[string]func(*slog.Logger){
		"plain":           func(l *slog.Logger) { l.Info("m", "a", 1) },
		"with":            func(l *slog.Logger) { l.With("a", 1).Info("m", "b", 2) },
		"group":           func(l *slog.Logger) { l.WithGroup("g").Info("m", "b", 2) },
		"empty group":     func(l *slog.Logger) { l.WithGroup("g").Info("m") },
		"group with":      func(l *slog.Logger) { l.WithGroup("g").With("a", 1).Info("m") },
		"two groups":      func(l *slog.Logger) { l.With("a", 1).WithGroup("g").With("b", 2).WithGroup("h").Info("m", "c", 3) },
		"inline group":    func(l *slog.Logger) { l.Info("m", slog.Group("", slog.Int("x", 1))) },
		"attr group":      func(l *slog.Logger) { l.WithGroup("g").Info("m", slog.Group("h", slog.Int("x", 1))) },
		"empty attrgroup": func(l *slog.Logger) { l.Info("m", slog.Group("h")) },
	}
	for name, logf := range cases {
		t.Run(name, func(t *testing.T) {
			var want, got bytes.Buffer
			logf(slog.New(slog.NewJSONHandler(&want, nil)))
			lg, _ := New(Config{Writer: &got}, nil)
			logf(lg)
			w, g := timeField.ReplaceAllString(want.String(), ""), timeField.ReplaceAllString(got.String(), "")
			if w != g {
				t.Errorf("pipeline wrote\n%s\nslog wrote\n%s", g, w)
			}
		})
	}
}

func TestLevelAppliesToBothSinks(t *testing.T) {
	var out bytes.Buffer
	lg, ring := New(Config{Format: FormatText, Level: slog.LevelWarn, Writer: &out}, nil)
	lg.Info("dropped_info")
	lg.Warn("kept_warn")
	if strings.Contains(out.String(), "dropped_info") || !strings.Contains(out.String(), "kept_warn") {
		t.Errorf("stderr sink: %s", out.String())
	}
	recs := ring.Recent(0)
	if len(recs) != 1 || recs[0].Message != "kept_warn" || recs[0].Level != "WARN" {
		t.Errorf("ring = %+v", recs)
	}
}

func TestRingIsBoundedAndOrdered(t *testing.T) {
	var out bytes.Buffer
	lg, ring := New(Config{Writer: &out, RingSize: 5}, nil)
	for i := range 12 {
		lg.Info("tick", "i", i, slog.Group("g", slog.String("k", "v")))
	}
	recs := ring.Recent(0)
	if len(recs) != 5 {
		t.Fatalf("ring holds %d records, want 5", len(recs))
	}
	for j, rec := range recs {
		want := fmt.Sprint(7 + j)
		if rec.Attrs[0] != (Field{Key: "i", Value: want}) || rec.Attrs[1] != (Field{Key: "g.k", Value: "v"}) {
			t.Errorf("record %d attrs = %+v, want i=%s g.k=v", j, rec.Attrs, want)
		}
		if rec.Seq != uint64(8+j) {
			t.Errorf("record %d seq = %d", j, rec.Seq)
		}
	}
	if last := ring.Recent(2); len(last) != 2 || last[1].Attrs[0].Value != "11" {
		t.Errorf("Recent(2) = %+v", last)
	}
	if since := ring.Since(10); len(since) != 2 || since[0].Seq != 11 {
		t.Errorf("Since(10) = %+v", since)
	}
	if since := ring.Since(0); len(since) != 5 {
		t.Errorf("Since(0) returned %d records, want the 5 kept", len(since))
	}
}

func TestParseFlags(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, " warn": slog.LevelWarn, "warning": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Error("ParseLevel accepted loud")
	}
	for in, want := range map[string]string{"json": FormatJSON, "Text": FormatText} {
		if got, err := ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseFormat("xml"); err == nil {
		t.Error("ParseFormat accepted xml")
	}
	err := Config{Format: "xml", RingSize: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "xml") || !strings.Contains(err.Error(), "-1") {
		t.Errorf("Validate did not report both problems: %v", err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config invalid: %v", err)
	}
}

// Registrations come and go while other goroutines log; a value that stays
// registered throughout must never appear. Run with -race.
func TestConcurrentRegistrationAndLogging(t *testing.T) {
	var out bytes.Buffer
	red := NewRedactor(credValue)
	lg, ring := New(Config{Writer: &out, RingSize: 64}, red)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := fmt.Sprintf("per-dispatch-secret-%d", g)
			child := lg.With("worker", g, "held", credValue)
			for i := range 200 {
				red.Add(own)
				child.Info("report", "i", i, "value", own, slog.Any("err", errors.New("failed with "+credValue)))
				red.Remove(own)
				_ = ring.Recent(10)
			}
		}()
	}
	wg.Wait()
	text := out.String()
	if n := strings.Count(text, "\n"); n != 800 {
		t.Fatalf("wrote %d records, want 800", n)
	}
	for g := range 4 {
		if own := fmt.Sprintf("per-dispatch-secret-%d", g); strings.Contains(text, own) {
			t.Errorf("value logged while registered leaked: %s", own)
		}
	}
	if strings.Contains(text, credValue) || strings.Contains(ringText(ring), credValue) {
		t.Error("permanently registered value leaked")
	}
}

func TestZeroRedactorIsUsable(t *testing.T) {
	var r Redactor
	if got := r.String("x" + lateSecret); got != "x"+lateSecret {
		t.Errorf("empty redactor changed text: %q", got)
	}
	r.Add(lateSecret)
	if got := r.String("x" + lateSecret); got != "x"+Redacted {
		t.Errorf("zero-value redactor after Add: %q", got)
	}
	var nilRed *Redactor
	var out bytes.Buffer
	lg, _ := New(Config{Writer: &out}, nilRed)
	lg.Info("m", "token", "unregistered-token-aaaa", "job_id", "j1")
	if strings.Contains(out.String(), "unregistered-token-aaaa") || !strings.Contains(out.String(), "j1") {
		t.Errorf("nil redactor: %s", out.String())
	}
}

func TestRingWakesWaiters(t *testing.T) {
	var out bytes.Buffer
	lg, ring := New(Config{Writer: &out}, nil)
	first := ring.Updated()
	if again := ring.Updated(); again != first {
		t.Fatal("two waiters before a record got different channels")
	}
	select {
	case <-first:
		t.Fatal("woken before any record")
	default:
	}
	done := make(chan []Record)
	go func() {
		<-first
		done <- ring.Since(0)
	}()
	lg.Info("job_admitted", "job_id", "j1")
	if recs := <-done; len(recs) != 1 || recs[0].Message != "job_admitted" {
		t.Fatalf("woken waiter read %+v", recs)
	}
	select {
	case <-ring.Updated():
		t.Fatal("a fresh channel was already closed")
	default:
	}
}
