//go:build race

package projection

// raceEnabled: the race detector allocates on its own, so allocation budgets are not checked under it.
const raceEnabled = true
