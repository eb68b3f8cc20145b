// Package logging builds jobfence's slog pipeline: one redaction step in front
// of every sink, then a fan-out (samber/slog-multi) to stderr as JSON or text
// and to an in-memory ring of recent records for the dashboard. Secrets
// (tokens, dispatch secrets, credential values) are registered with a
// Redactor at run time and never reach a sink, whatever attribute carries them.
package logging

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	slogmulti "github.com/samber/slog-multi"
)

// Output formats for --log-format.
const (
	FormatJSON = "json"
	FormatText = "text"
)

// Config is the logging part of a runnable's configuration.
type Config struct {
	// Format is FormatJSON or FormatText (--log-format); "" means JSON.
	Format string
	// Level is the lowest level written (--log-level); the zero value is info.
	Level slog.Level
	// Writer receives the formatted records; nil means os.Stderr.
	Writer io.Writer
	// RingSize bounds the recent-records ring; 0 means DefaultRingSize.
	RingSize int
}

// Validate returns every problem at once.
func (c Config) Validate() error {
	var errs []error
	switch c.Format {
	case "", FormatJSON, FormatText:
	default:
		errs = append(errs, fmt.Errorf("log format %q: want json or text", c.Format))
	}
	if c.RingSize < 0 {
		errs = append(errs, fmt.Errorf("ring size %d: must not be negative", c.RingSize))
	}
	return errors.Join(errs...)
}

// New returns the logger every component derives its own from, and the ring
// it feeds. secrets may be nil (secret keys are still dropped) and may gain
// values after New returns; records handled afterwards are scrubbed of them,
// including attributes attached earlier with With. An unknown Format is
// written as JSON: call Validate first to reject it.
func New(cfg Config, secrets *Redactor) (*slog.Logger, *Ring) {
	w := cfg.Writer
	if w == nil {
		w = os.Stderr
	}
	opts := &slog.HandlerOptions{Level: cfg.Level}
	var out slog.Handler
	if cfg.Format == FormatText {
		out = slog.NewTextHandler(w, opts)
	} else {
		out = slog.NewJSONHandler(w, opts)
	}
	ring := NewRing(cfg.RingSize)
	h := slogmulti.Pipe(secrets.Middleware()).Handler(slogmulti.Fanout(out, ring.Handler(cfg.Level)))
	return slog.New(h), ring
}

// ParseFormat reads a --log-format value.
func ParseFormat(s string) (string, error) {
	switch f := strings.ToLower(strings.TrimSpace(s)); f {
	case FormatJSON, FormatText:
		return f, nil
	}
	return "", fmt.Errorf("log format %q: want json or text", s)
}

// ParseLevel reads a --log-level value: debug, info, warn (or warning), error.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}
