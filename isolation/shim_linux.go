package isolation

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// probeWait is the argument the preflight gives the canary: it blocks until
// the preflight kills the domain.
const probeWait = "probe-wait"

// ShimMain is the whole "jobfence worker" command: the canary the preflight
// starts inside its probe domain. args are what follows "worker". Commands
// are never started through it: the agent execs them directly and parks
// them at their exec stop (see startWorker).
func ShimMain(args []string) int {
	if len(args) == 1 && args[0] == probeWait {
		for {
			time.Sleep(time.Hour)
		}
	}
	fmt.Fprintln(os.Stderr, "jobfence worker is the agent's preflight canary; it takes no arguments")
	return 2
}

func hasMembership(lines []string, m membership) bool {
	for _, line := range lines {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[2] != m.Path {
			continue
		}
		if m.Controller == "" && parts[0] == "0" && parts[1] == "" {
			return true
		}
		if m.Controller != "" && slices.Contains(strings.Split(parts[1], ","), m.Controller) {
			return true
		}
	}
	return false
}
