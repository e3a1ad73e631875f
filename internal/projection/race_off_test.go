//go:build !race

package projection

const raceEnabled = false
