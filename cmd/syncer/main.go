// Command syncer is raysync: it keeps every in-scope RayCluster's auth token equal to one canonical
// Secret, next to the stock KubeRay operator. Its command line and work are in cmd/syncer/app.
package main

import (
	"os"

	"github.com/raysync/raysync/cmd/syncer/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}
