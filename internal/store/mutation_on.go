//go:build jobfence_mutation

package store

import (
	"os"
	"strings"
)

func init() {
	for _, m := range strings.Split(os.Getenv("JOBFENCE_MUTATION"), ",") {
		switch m {
		case "skip-fence-compare":
			mutationSkipFenceCompare = true
		case "skip-leader-compare":
			mutationSkipLeaderCompare = true
		}
	}
}
