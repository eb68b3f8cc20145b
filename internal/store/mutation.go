package store

// Mutation switches for the fault-injection suite (chaos/). Each one breaks
// a mechanism a chaos checker guards, so the suite can show the checker
// catches it. Only mutation_on.go, compiled with -tags jobfence_mutation,
// ever sets them; in every other build they stay false.
var (
	// mutationSkipFenceCompare drops the fence compare from admission (I2).
	mutationSkipFenceCompare bool
	// mutationSkipLeaderCompare drops the election-key compare from
	// leader-only writes (I7).
	mutationSkipLeaderCompare bool
)
