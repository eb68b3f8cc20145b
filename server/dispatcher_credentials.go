package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"
)

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// credentialProfiles resolves profile names to environment variables from a
// file re-read whenever its size or mtime changes. Values are held
// only in memory and handed to the agent in the dispatch request; no error,
// log line or stored record carries them.
type credentialProfiles struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex
	stamp    fileStamp
	profiles map[string]map[string]string
	loadErr  error // why the current file could not be used; nil when it could
	missing  bool  // the last stat failed (logged once, not every round)
}

type fileStamp struct {
	size  int64
	mtime time.Time
}

func statFile(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{size: fi.Size(), mtime: fi.ModTime()}, nil
}

func newCredentialProfiles(path string, log *slog.Logger) *credentialProfiles {
	return &credentialProfiles{path: path, log: log}
}

// errNoCredentialsFile: a job names a profile but the server has no file.
var errNoCredentialsFile = errors.New("no credentials file is configured")

// resolve returns the variables of profile. The error text names the
// profile, never a value, because it becomes the job's blocked reason.
func (c *credentialProfiles) resolve(profile string) (map[string]string, error) {
	if profile == "" {
		return nil, nil
	}
	if c == nil || c.path == "" {
		return nil, errNoCredentialsFile
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.profiles == nil && c.loadErr != nil {
		return nil, c.loadErr
	}
	vars, ok := c.profiles[profile]
	if !ok {
		return nil, fmt.Errorf("credential profile %q is not in the credentials file", profile)
	}
	out := make(map[string]string, len(vars))
	for k, v := range vars {
		out[k] = v
	}
	return out, nil
}

// refresh re-reads the file if it changed; the dispatcher calls it once per
// round, not once per job.
func (c *credentialProfiles) refresh() {
	if c == nil || c.path == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reloadLocked()
}

// reloadLocked re-reads the file when it changed. A file that is mid-edit or
// broken keeps the last good profiles in force, so an editor's partial write
// does not block every job; a file that never parsed blocks jobs that need it.
func (c *credentialProfiles) reloadLocked() {
	st, err := statFile(c.path)
	if err != nil {
		if !c.missing {
			c.log.Warn("credentials_file_unreadable", "path", c.path, "err", err)
		}
		c.missing = true
		c.stamp = fileStamp{}
		c.profiles = nil
		c.loadErr = errors.New("the credentials file cannot be read")
		return
	}
	c.missing = false
	if st == c.stamp {
		return
	}
	data, err := os.ReadFile(c.path)
	if err != nil {
		c.loadErr = errors.New("the credentials file cannot be read")
		c.log.Warn("credentials_file_unreadable", "path", c.path, "err", err)
		return
	}
	profiles, problem := parseProfiles(data)
	if problem != "" {
		// The stamp is kept so a broken file is reported once, not every round.
		c.stamp = st
		c.loadErr = errors.New("the credentials file is not valid: " + problem)
		c.log.Warn("credentials_file_rejected", "path", c.path, "problem", problem)
		return
	}
	c.stamp = st
	c.profiles = profiles
	c.loadErr = nil
	c.log.Info("credentials_file_loaded", "path", c.path, "profiles", len(profiles))
}

// parseProfiles returns a problem in words that never quotes the input, since
// the input holds secrets.
func parseProfiles(data []byte) (map[string]map[string]string, string) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw map[string]map[string]string
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Sprintf("JSON syntax error at byte %d", se.Offset)
		}
		return nil, `expected {"profile": {"ENV_NAME": "value"}}`
	}
	if dec.More() {
		return nil, "trailing data after the JSON object"
	}
	if raw == nil {
		return nil, `expected {"profile": {"ENV_NAME": "value"}}`
	}
	for name, vars := range raw {
		for k := range vars {
			if !envNamePattern.MatchString(k) {
				return nil, fmt.Sprintf("profile %q has a variable name that is not [A-Za-z_][A-Za-z0-9_]*", name)
			}
		}
	}
	return raw, ""
}
