package app

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a CPU profile of the whole run to the file $RAYSYNC_CPUPROFILE names, when
// set: the bench profiles raysync's side of a fan-out with it. The returned func ends the profile.
func startCPUProfile(getenv func(string) string) (stop func(), err error) {
	path := getenv("RAYSYNC_CPUPROFILE")
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("RAYSYNC_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("RAYSYNC_CPUPROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
