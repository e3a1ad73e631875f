// Command registry is distribution's registry v3 with what the real node's registry uses: htpasswd
// authentication and the filesystem storage driver (plus inmemory). distribution's own cmd/registry
// also links the azure, gcs and s3 storage drivers with their cloud SDKs, which cost minutes of a cold
// make test on 2 cores and nothing here uses; the server is the same registry package.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
