//go:build jobfence_mutation

package jobs

import (
	"os"
	"strings"
)

func init() {
	for _, m := range strings.Split(os.Getenv("JOBFENCE_MUTATION"), ",") {
		if m == "accept-any-secret" {
			mutationAcceptAnySecret = true
		}
	}
}
