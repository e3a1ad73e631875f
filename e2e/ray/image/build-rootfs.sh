#!/bin/sh
# Builds the root filesystem of the e2e Ray image into $1: Debian bookworm (debootstrap, minbase) with
# Python 3.11, bash, wget (KubeRay's default probes run `wget ... | grep success` through bash) and
# Ray from the hash-pinned wheels in $2 (downloaded beforehand, checked again here against $3, the
# lock file), installed into the system Python (/usr/local), and the user ray (uid 1000, gid 100,
# HOME /home/ray) as in Ray's own images. Needs root and Debian's package mirror; installs debootstrap
# once if it is missing.
set -eu
rootfs=$1 wheels=$2 requirements=$3
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

rm -rf "$rootfs"
mkdir -p "$rootfs"
debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,wget,ca-certificates \
	bookworm "$rootfs" "$mirror" >"$rootfs.debootstrap.log" 2>&1 || { tail -30 "$rootfs.debootstrap.log" >&2; exit 1; }

mkdir -p "$rootfs/tmp/wheels"
mount --bind "$wheels" "$rootfs/tmp/wheels"
cp "$requirements" "$rootfs/tmp/requirements.txt"
trap 'umount "$rootfs/tmp/wheels" 2>/dev/null || true' EXIT
# No index: every wheel comes from $2 and must match a hash of the lock file.
chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
	python3 -m pip install --no-index --find-links /tmp/wheels --require-hashes --no-deps --no-cache-dir \
	--disable-pip-version-check --break-system-packages --root-user-action=ignore -q -r /tmp/requirements.txt
umount "$rootfs/tmp/wheels"
trap - EXIT
rmdir "$rootfs/tmp/wheels"
rm -f "$rootfs/tmp/requirements.txt"

# Ray imports in the rootfs as the image runs it (debootstrap's /dev nodes are still there).
chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root python -c 'import ray; print("ray", ray.__version__)'
chroot "$rootfs" useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray

# Cheap size: no package lists or caches, docs, man pages or locales (Python's bytecode stays: every
# Ray process imports hundreds of modules, and a non-root container cannot write the caches back).
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
	"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
	"$rootfs"/var/log/* "$rootfs"/root/.cache "$rootfs"/tmp/* "$rootfs"/dev/*
