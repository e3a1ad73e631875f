#!/usr/bin/env bash
# make docs: installs mkdocs and the Material theme from the hash-pinned docs/requirements.txt into a
# virtualenv under the cache (as the harness installs Ray: once, rebuilt when the lock file changes),
# then builds the site strictly: a broken link or anchor, or a page missing from the navigation, fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${RAYSYNC_CACHE_DIR:-$root/.cache}
case $cache in /*) ;; *) cache=$root/$cache ;; esac
lock=$root/docs/requirements.txt
want=$(sha256sum "$lock" | cut -d' ' -f1)
venv=$cache/mkdocs
mkdir -p "$cache"
python=
for p in python3.11 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then python=$(command -v "$p"); break; fi
done
[ -n "$python" ] || { echo "make docs needs Python 3.9+ with venv and pip (3.11 is what we test)" >&2; exit 1; }
(
  flock 9
  if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
    echo "installing mkdocs into $venv (first run only; ~20 s)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check --require-hashes --no-deps -r "$lock"
    echo -n "$want" > "$venv/.installed"
  fi
) 9>"$cache/mkdocs.lock"
cd "$root"
export NO_MKDOCS_2_WARNING=1
exec "$venv/bin/mkdocs" build --strict --site-dir "$root/site" "$@"
