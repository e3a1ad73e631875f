// Command coredns is CoreDNS v1.15 with the plugins a kubeadm cluster's Corefile uses, built the way
// CoreDNS documents for a custom plugin set (coremain.Run with the plugins imported): the real node's
// cluster DNS. The stock main imports every plugin, with the cloud SDKs of route53, azure and
// clouddns, which cost minutes of a cold make test on 2 cores and nothing here uses.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
