package jobs

import (
	"fmt"
	"net/url"
	"path"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Input bounds from API.md "Input rules". Explicit zeros are out of bounds;
// omitted fields take Defaults.
const (
	MaxPartBytes        = 255
	MaxOperationBytes   = 64
	MaxCommandArgs      = 256
	MaxCommandBytes     = 128 << 10
	MaxEnvEntries       = 256
	MaxEnvValueBytes    = 32 << 10
	MaxCredentialsBytes = 255
	MaxPathBytes        = 4096
	MinMemoryBytes      = 4 << 20
	MaxPids             = 65536
	MaxDeadlineSeconds  = 604800
	MaxExitCode         = 255
	MaxExitCodesPerSet  = 256
	MaxURLBytes         = 2048
	MaxLabels           = 64
	MaxLabelKeyBytes    = 63
	MaxLabelValueBytes  = 255
	MaxNoteBytes        = 1024
)

// Printable reports whether s is valid UTF-8 made only of characters
// unicode.IsPrint accepts, which excludes NUL, control and format characters
// (RTL overrides, zero-width joiners) that could disguise a value on a page.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ParseTarget splits "scope/name" at the first slash. Scope and Name are
// trimmed and lower-cased (the fence is on them); Display keeps the trimmed
// spelling the submitter used.
func ParseTarget(s string) (Target, error) {
	if !Printable(s) {
		return Target{}, fmt.Errorf("must be printable UTF-8")
	}
	scope, name, ok := strings.Cut(s, "/")
	if !ok {
		return Target{}, fmt.Errorf("must be scope/name")
	}
	scope, name = strings.TrimSpace(scope), strings.TrimSpace(name)
	if n := len(scope); n < 1 || n > MaxPartBytes {
		return Target{}, fmt.Errorf("scope must be 1-%d bytes", MaxPartBytes)
	}
	if n := len(name); n < 1 || n > MaxPartBytes {
		return Target{}, fmt.Errorf("name must be 1-%d bytes", MaxPartBytes)
	}
	return Target{
		Scope:   strings.ToLower(scope),
		Name:    strings.ToLower(name),
		Display: scope + "/" + name,
	}, nil
}

// ValidateNote checks an operator's force-release note.
func ValidateNote(note string) error {
	if n := len(note); n < 1 || n > MaxNoteBytes {
		return fmt.Errorf("must be 1-%d bytes", MaxNoteBytes)
	}
	if !Printable(note) {
		return fmt.Errorf("must be printable UTF-8")
	}
	return nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case i > 0 && r >= '0' && r <= '9':
		default:
			return false
		}
	}
	return true
}

// sortedKeys makes field errors come out in a stable order.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Validate checks every field at once and returns the normalized target and
// the spec with defaults applied, or a *ValidationError naming each bad field
// by its JSON path.
func (s *Submission) Validate(d Defaults) (Target, Spec, error) {
	ve := &ValidationError{}
	var target Target
	if s.Target == "" {
		ve.Add("target", "is required")
	} else if t, err := ParseTarget(s.Target); err != nil {
		ve.Add("target", err.Error())
	} else {
		target = t
	}
	if len(s.Operation) > MaxOperationBytes {
		ve.Add("operation", fmt.Sprintf("must be at most %d bytes", MaxOperationBytes))
	} else if !Printable(s.Operation) {
		ve.Add("operation", "must be printable UTF-8")
	}

	spec := Spec{Credentials: s.Credentials, WorkingDir: s.WorkingDir}
	switch n := len(s.Command); {
	case s.Command == nil || n == 0:
		ve.Add("command", "is required (1-256 arguments)")
	case n > MaxCommandArgs:
		ve.Add("command", fmt.Sprintf("must have at most %d arguments", MaxCommandArgs))
	default:
		total := 0
		for i, a := range s.Command {
			total += len(a)
			field := fmt.Sprintf("command[%d]", i)
			if !Printable(a) {
				ve.Add(field, "must be printable UTF-8")
			} else if i == 0 && !path.IsAbs(a) {
				ve.Add(field, "must be an absolute path")
			}
		}
		if total > MaxCommandBytes {
			ve.Add("command", fmt.Sprintf("must be at most %d bytes in all", MaxCommandBytes))
		}
		spec.Command = append([]string(nil), s.Command...)
	}

	if len(s.Env) > MaxEnvEntries {
		ve.Add("env", fmt.Sprintf("must have at most %d entries", MaxEnvEntries))
	} else if len(s.Env) > 0 {
		spec.Env = make(map[string]string, len(s.Env))
		for _, k := range sortedKeys(s.Env) {
			v := s.Env[k]
			field := "env." + k
			switch {
			case !validEnvName(k):
				ve.Add(field, "name must match [A-Za-z_][A-Za-z0-9_]*")
			case len(v) > MaxEnvValueBytes:
				ve.Add(field, fmt.Sprintf("value must be at most %d bytes", MaxEnvValueBytes))
			case !Printable(v):
				ve.Add(field, "value must be printable UTF-8")
			}
			spec.Env[k] = v
		}
	}

	if len(s.Credentials) > MaxCredentialsBytes {
		ve.Add("credentials", fmt.Sprintf("must be at most %d bytes", MaxCredentialsBytes))
	} else if !Printable(s.Credentials) {
		ve.Add("credentials", "must be printable UTF-8")
	}

	if s.WorkingDir == "" {
		spec.WorkingDir = "/"
	} else if len(s.WorkingDir) > MaxPathBytes || !Printable(s.WorkingDir) {
		ve.Add("working_dir", "must be a printable path of at most 4096 bytes")
	} else if !path.IsAbs(s.WorkingDir) || path.Clean(s.WorkingDir) != s.WorkingDir {
		ve.Add("working_dir", "must be an absolute, clean path")
	}

	spec.Limits = Limits{MemoryBytes: d.MemoryBytes, Pids: d.Pids, DeadlineSeconds: d.DeadlineSeconds}
	if l := s.Limits; l != nil {
		if l.MemoryBytes != nil {
			v := *l.MemoryBytes
			maxMem := d.MaxMemoryBytes
			if v < MinMemoryBytes || (maxMem > 0 && v > maxMem) {
				ve.Add("limits.memory_bytes", fmt.Sprintf("must be between %d and %d", int64(MinMemoryBytes), maxMem))
			}
			spec.Limits.MemoryBytes = v
		}
		if l.Pids != nil {
			if v := *l.Pids; v < 1 || v > MaxPids {
				ve.Add("limits.pids", fmt.Sprintf("must be between 1 and %d", MaxPids))
			}
			spec.Limits.Pids = *l.Pids
		}
		if l.DeadlineSeconds != nil {
			if v := *l.DeadlineSeconds; v < 1 || v > MaxDeadlineSeconds {
				ve.Add("limits.deadline_seconds", fmt.Sprintf("must be between 1 and %d", MaxDeadlineSeconds))
			}
			spec.Limits.DeadlineSeconds = *l.DeadlineSeconds
		}
	}

	spec.Outcome = Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}}
	if o := s.Outcome; o != nil {
		if o.CommittedExitCodes != nil {
			checkExitSet(ve, "outcome.committed_exit_codes", o.CommittedExitCodes, true)
			spec.Outcome.CommittedExitCodes = append([]int{}, o.CommittedExitCodes...)
		}
		if o.NotCommittedExitCodes != nil {
			checkExitSet(ve, "outcome.not_committed_exit_codes", o.NotCommittedExitCodes, false)
			spec.Outcome.NotCommittedExitCodes = append([]int{}, o.NotCommittedExitCodes...)
		}
		committed := map[int]bool{}
		for _, c := range spec.Outcome.CommittedExitCodes {
			committed[c] = true
		}
		for _, c := range spec.Outcome.NotCommittedExitCodes {
			if committed[c] {
				ve.Add("outcome.not_committed_exit_codes", fmt.Sprintf("exit code %d is also in committed_exit_codes", c))
				break
			}
		}
	}

	if s.Refresh != nil {
		u := s.Refresh.URL
		parsed, err := url.Parse(u)
		switch {
		case u == "" || len(u) > MaxURLBytes || !Printable(u):
			ve.Add("refresh.url", fmt.Sprintf("must be a printable URL of 1-%d bytes", MaxURLBytes))
		case err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "":
			ve.Add("refresh.url", "must be an http or https URL with a host")
		}
		spec.Refresh = &Refresh{URL: u}
	}

	if len(s.Labels) > MaxLabels {
		ve.Add("labels", fmt.Sprintf("must have at most %d entries", MaxLabels))
	} else if len(s.Labels) > 0 {
		spec.Labels = make(map[string]string, len(s.Labels))
		for _, k := range sortedKeys(s.Labels) {
			v := s.Labels[k]
			switch {
			case len(k) < 1 || len(k) > MaxLabelKeyBytes || !Printable(k):
				ve.Add("labels", fmt.Sprintf("key %q must be 1-%d printable bytes", k, MaxLabelKeyBytes))
			case len(v) > MaxLabelValueBytes || !Printable(v):
				ve.Add("labels", fmt.Sprintf("value of %q must be at most %d printable bytes", k, MaxLabelValueBytes))
			}
			spec.Labels[k] = v
		}
	}

	if err := ve.Err(); err != nil {
		return Target{}, Spec{}, err
	}
	return target, spec, nil
}

func checkExitSet(ve *ValidationError, field string, codes []int, nonEmpty bool) {
	if nonEmpty && len(codes) == 0 {
		ve.Add(field, "must not be empty")
		return
	}
	if len(codes) > MaxExitCodesPerSet {
		ve.Add(field, fmt.Sprintf("must have at most %d codes", MaxExitCodesPerSet))
		return
	}
	seen := map[int]bool{}
	for _, c := range codes {
		if c < 0 || c > MaxExitCode {
			ve.Add(field, fmt.Sprintf("exit code %d is outside 0-%d", c, MaxExitCode))
			return
		}
		if seen[c] {
			ve.Add(field, fmt.Sprintf("exit code %d is repeated", c))
			return
		}
		seen[c] = true
	}
}
