package store

import (
	"context"
	"fmt"
)

// Ping makes one linearizable read of a single fixed key, so readiness costs
// the same whatever the number of retained jobs: it proves a quorum answers.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.cli.Get(ctx, s.k.settingAdmission()); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}
