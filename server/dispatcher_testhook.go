//go:build jobfence_testhooks

package server

import "os"

// Binaries built with -tags jobfence_testhooks (the end-to-end tests build
// them so) can be made to die between a committed markRunning and the send,
// the window a leader crash leaves a job RUNNING with nothing sent.
func init() {
	if os.Getenv("JOBFENCE_TEST_EXIT_AFTER_MARK_RUNNING") == "1" {
		testHookAfterMarkRunning = func(string) bool {
			os.Exit(86)
			return true
		}
	}
}
