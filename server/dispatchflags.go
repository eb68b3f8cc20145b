package server

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// DispatchConfig configures the leader's dispatcher, refresh driver and
// retention. The zero value is not usable: start from DefaultDispatchConfig.
type DispatchConfig struct {
	// Interval between the starts of two rounds (--dispatch-interval).
	Interval time.Duration
	// PerRound caps the jobs markRunning may take in one round (--dispatch-per-round).
	PerRound int
	// CredentialsFile holds the credential profiles, JSON
	// {"profile": {"ENV_NAME": "value"}}; re-read when it changes. "" = none.
	CredentialsFile string
	// DispatchTokenFile holds the bearer token the server presents to agents.
	DispatchTokenFile string
	// RefreshRetry is the least time between two attempts of a FAILED refresh.
	RefreshRetry time.Duration
	// RefreshTimeout bounds one call of a refresh hook.
	RefreshTimeout time.Duration
	// Retention is how long a resolved job is kept before removal.
	Retention time.Duration
	// RetentionBatch bounds one removal transaction.
	RetentionBatch int
	// RetentionEvery is how often the leader looks for expired jobs.
	RetentionEvery time.Duration
	// SendTimeout bounds one POST /v1/dispatches; a timeout is not a refusal.
	SendTimeout time.Duration
	// QueryTimeout bounds one tombstone query.
	QueryTimeout time.Duration
	// PhaseBudget bounds the blocking time of each phase of one round; work
	// left over waits for the next round.
	PhaseBudget time.Duration
}

// DefaultDispatchConfig returns the documented defaults.
func DefaultDispatchConfig() DispatchConfig {
	return DispatchConfig{
		Interval:       time.Second,
		PerRound:       16,
		RefreshRetry:   300 * time.Second,
		RefreshTimeout: 10 * time.Second,
		Retention:      168 * time.Hour,
		RetentionBatch: 64,
		RetentionEvery: time.Minute,
		SendTimeout:    5 * time.Second,
		QueryTimeout:   2 * time.Second,
		PhaseBudget:    5 * time.Second,
	}
}

// Validate reports every problem at once.
func (c DispatchConfig) Validate() error {
	var errs []error
	positive := func(name string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, d))
		}
	}
	positive("dispatch-interval", c.Interval)
	positive("refresh-retry", c.RefreshRetry)
	positive("refresh timeout", c.RefreshTimeout)
	positive("retention", c.Retention)
	positive("retention interval", c.RetentionEvery)
	positive("send timeout", c.SendTimeout)
	positive("query timeout", c.QueryTimeout)
	positive("phase budget", c.PhaseBudget)
	if c.PerRound < 1 {
		errs = append(errs, fmt.Errorf("dispatch-per-round must be at least 1, got %d", c.PerRound))
	}
	if c.RetentionBatch < 1 {
		errs = append(errs, fmt.Errorf("retention batch must be at least 1, got %d", c.RetentionBatch))
	}
	return errors.Join(errs...)
}

// RegisterDispatchFlags binds the dispatcher's flags to c, with c's current
// values as defaults.
func RegisterDispatchFlags(fs *flag.FlagSet, c *DispatchConfig) {
	fs.DurationVar(&c.Interval, "dispatch-interval", c.Interval, "time between dispatcher rounds")
	fs.IntVar(&c.PerRound, "dispatch-per-round", c.PerRound, "most jobs dispatched in one round")
	fs.StringVar(&c.CredentialsFile, "credentials-file", c.CredentialsFile, `credential profiles, JSON {"profile": {"ENV_NAME": "value"}}; re-read on change`)
	fs.DurationVar(&c.RefreshRetry, "refresh-retry", c.RefreshRetry, "least time between two attempts of a FAILED refresh")
	fs.DurationVar(&c.Retention, "retention", c.Retention, "how long resolved jobs are kept")
	fs.StringVar(&c.DispatchTokenFile, "dispatch-token-file", c.DispatchTokenFile, "file holding the token the server presents to agents")
}
