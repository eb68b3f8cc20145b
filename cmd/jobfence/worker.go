package main

import "jobfence/isolation"

// runWorker is the canary the agent's isolation preflight starts inside its
// probe domain; see isolation.ShimMain. Job commands never go through it.
func runWorker(args []string) int { return isolation.ShimMain(args) }
