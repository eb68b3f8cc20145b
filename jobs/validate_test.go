package jobs

import (
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

var testDefaults = Defaults{MemoryBytes: 256 << 20, MaxMemoryBytes: 1 << 30, Pids: 64, DeadlineSeconds: 600}

func i64(v int64) *int64 { return &v }

func fields(err error) []string {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return nil
	}
	var out []string
	for _, e := range ve.Errors {
		out = append(out, e.Field)
	}
	return out
}

func TestValidateDefaultsAndNormalization(t *testing.T) {
	s := Submission{Target: "  Warehouse.Orders / IDX_Customer ", Command: []string{"/bin/true"}}
	target, spec, err := s.Validate(testDefaults)
	if err != nil {
		t.Fatal(err)
	}
	if target.Scope != "warehouse.orders" || target.Name != "idx_customer" || target.Display != "Warehouse.Orders/IDX_Customer" {
		t.Fatalf("target %+v", target)
	}
	if spec.Limits != (Limits{MemoryBytes: 256 << 20, Pids: 64, DeadlineSeconds: 600}) {
		t.Fatalf("limits %+v", spec.Limits)
	}
	if !slices.Equal(spec.Outcome.CommittedExitCodes, []int{0}) || len(spec.Outcome.NotCommittedExitCodes) != 0 || spec.WorkingDir != "/" {
		t.Fatalf("outcome %+v dir %q", spec.Outcome, spec.WorkingDir)
	}
}

func TestValidateFieldErrors(t *testing.T) {
	long := strings.Repeat("a", 256)
	cases := []struct {
		name string
		s    Submission
		want []string
	}{
		{"missing target and command", Submission{}, []string{"target", "command"}},
		{"no slash", Submission{Target: "abc", Command: []string{"/x"}}, []string{"target"}},
		{"empty name", Submission{Target: "a/ ", Command: []string{"/x"}}, []string{"target"}},
		{"long scope", Submission{Target: long + "/n", Command: []string{"/x"}}, []string{"target"}},
		{"rtl override", Submission{Target: "a/b\u202e", Command: []string{"/x"}}, []string{"target"}},
		{"zero width joiner", Submission{Target: "a/b\u200d", Command: []string{"/x"}}, []string{"target"}},
		{"relative command", Submission{Target: "a/b", Command: []string{"bin/x"}}, []string{"command[0]"}},
		{"nul in arg", Submission{Target: "a/b", Command: []string{"/x", "a\x00b"}}, []string{"command[1]"}},
		{"too many args", Submission{Target: "a/b", Command: append([]string{"/x"}, make([]string, 256)...)}, []string{"command"}},
		{"too big command", Submission{Target: "a/b", Command: []string{"/x", strings.Repeat("a", 128<<10)}}, []string{"command"}},
		{"bad env name", Submission{Target: "a/b", Command: []string{"/x"}, Env: map[string]string{"1X": "v", "OK": "v"}}, []string{"env.1X"}},
		{"bad env value", Submission{Target: "a/b", Command: []string{"/x"}, Env: map[string]string{"FOO": "a\nb"}}, []string{"env.FOO"}},
		{"long operation", Submission{Target: "a/b", Command: []string{"/x"}, Operation: strings.Repeat("o", 65)}, []string{"operation"}},
		{"relative dir", Submission{Target: "a/b", Command: []string{"/x"}, WorkingDir: "tmp"}, []string{"working_dir"}},
		{"unclean dir", Submission{Target: "a/b", Command: []string{"/x"}, WorkingDir: "/tmp/../etc"}, []string{"working_dir"}},
		{"zero memory", Submission{Target: "a/b", Command: []string{"/x"}, Limits: &SubmissionLimits{MemoryBytes: i64(0)}}, []string{"limits.memory_bytes"}},
		{"memory over max", Submission{Target: "a/b", Command: []string{"/x"}, Limits: &SubmissionLimits{MemoryBytes: i64(2 << 30)}}, []string{"limits.memory_bytes"}},
		{"zero pids and deadline", Submission{Target: "a/b", Command: []string{"/x"}, Limits: &SubmissionLimits{Pids: i64(0), DeadlineSeconds: i64(0)}}, []string{"limits.pids", "limits.deadline_seconds"}},
		{"deadline too long", Submission{Target: "a/b", Command: []string{"/x"}, Limits: &SubmissionLimits{DeadlineSeconds: i64(604801)}}, []string{"limits.deadline_seconds"}},
		{"exit code range", Submission{Target: "a/b", Command: []string{"/x"}, Outcome: &SubmissionOutcome{CommittedExitCodes: []int{256}}}, []string{"outcome.committed_exit_codes"}},
		{"sets overlap", Submission{Target: "a/b", Command: []string{"/x"}, Outcome: &SubmissionOutcome{NotCommittedExitCodes: []int{0}}}, []string{"outcome.not_committed_exit_codes"}},
		{"empty committed set", Submission{Target: "a/b", Command: []string{"/x"}, Outcome: &SubmissionOutcome{CommittedExitCodes: []int{}}}, []string{"outcome.committed_exit_codes"}},
		{"refresh scheme", Submission{Target: "a/b", Command: []string{"/x"}, Refresh: &Refresh{URL: "ftp://h/x"}}, []string{"refresh.url"}},
		{"refresh no host", Submission{Target: "a/b", Command: []string{"/x"}, Refresh: &Refresh{URL: "http:///x"}}, []string{"refresh.url"}},
		{"label key", Submission{Target: "a/b", Command: []string{"/x"}, Labels: map[string]string{strings.Repeat("k", 64): "v"}}, []string{"labels"}},
		{"credentials", Submission{Target: "a/b", Command: []string{"/x"}, Credentials: "a\tb"}, []string{"credentials"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := c.s.Validate(testDefaults)
			if got := fields(err); !slices.Equal(got, c.want) {
				t.Fatalf("fields %v, want %v (err %v)", got, c.want, err)
			}
		})
	}
}

func TestValidateNote(t *testing.T) {
	for _, bad := range []string{"", strings.Repeat("n", 1025), "a\x00b", "rtl\u202e"} {
		if ValidateNote(bad) == nil {
			t.Errorf("note %q accepted", bad)
		}
	}
	if err := ValidateNote("checked by hand"); err != nil {
		t.Error(err)
	}
}

// The domain must stay free of etcd, chi, templ and net/http.
func TestImportsStandardLibraryOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-json=ImportPath,Standard", ".").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath string
			Standard   bool
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.ImportPath == "jobfence/jobs" {
			continue
		}
		if !p.Standard || p.ImportPath == "net/http" {
			t.Errorf("jobs depends on %s", p.ImportPath)
		}
	}
}

// FuzzValidate: any submission either fails with field errors or yields a
// spec inside the bounds.
func FuzzValidate(f *testing.F) {
	f.Add("a/b", "/bin/true", "FOO", "bar", int64(1<<22), int64(1), 0, 3, "http://h/x")
	f.Add(" A / B ", "rel", "1X", "\x00", int64(0), int64(0), 256, 0, "ftp://")
	f.Fuzz(func(t *testing.T, target, cmd, envK, envV string, mem, pids int64, c, nc int, url string) {
		s := Submission{Target: target, Command: []string{cmd}, Env: map[string]string{envK: envV},
			Limits:  &SubmissionLimits{MemoryBytes: &mem, Pids: &pids},
			Outcome: &SubmissionOutcome{CommittedExitCodes: []int{c}, NotCommittedExitCodes: []int{nc}},
			Refresh: &Refresh{URL: url}}
		tg, spec, err := s.Validate(testDefaults)
		if err != nil {
			if len(fields(err)) == 0 {
				t.Fatalf("error without field entries: %v", err)
			}
			return
		}
		if tg.Scope == "" || tg.Name == "" || !Printable(tg.Display) || !Printable(spec.Command[0]) ||
			spec.Limits.MemoryBytes < MinMemoryBytes || spec.Limits.Pids < 1 || c == nc {
			t.Fatalf("accepted out-of-bounds submission: %+v %+v", tg, spec)
		}
	})
}
