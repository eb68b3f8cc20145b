package jobs

// mutationAcceptAnySecret skips the secret comparison of a result envelope.
// It exists for the fault-injection suite (chaos/), which shows its checker
// catches the broken build; only mutation_on.go, compiled with -tags
// jobfence_mutation, sets it.
var mutationAcceptAnySecret bool
