#!/bin/sh
# Installs Debian's Chromium for the browser test (TestRealRayThroughTheGateway's dashboard step), once:
# CI machines do not have it. Needs root and Debian's package mirrors.
set -eu
if [ -x /usr/bin/chromium ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "installing Chromium needs root (apt-get install chromium)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
/usr/bin/chromium --version
