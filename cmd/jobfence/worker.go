package main

import "jobfence/isolation"

// runWorker is the shim the agent starts inside a fresh domain; see
// isolation.ShimMain. It returns only when the command was not exec'd.
func runWorker(args []string) int { return isolation.ShimMain(args) }
