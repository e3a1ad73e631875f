#!/bin/sh
# Installs the Debian packages the real node needs and the Go module proxy cannot give: runc (cgo and
# libseccomp), iptables for kube-proxy and the CNI bridge's masquerading, conntrack. Once; needs root
# and Debian's package mirrors.
set -eu
if [ -x /usr/sbin/runc ] && [ -x /usr/sbin/iptables ] && [ -x /usr/sbin/conntrack ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "the real node needs root (apt-get install runc iptables conntrack)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends runc iptables conntrack >/dev/null
runc --version | head -1
