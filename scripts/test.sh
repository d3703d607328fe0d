#!/usr/bin/env bash
# The test command (README quick start, .ci/run): installs what is missing, then runs pytest.
#   bash scripts/test.sh [pytest args...]
# System parts: iproute2 (network-namespace hosts), FUSE (fuse3 for fusermount3 and /etc/fuse.conf; libfuse3-dev and pkg-config to
# build pyfuse3), chromium + chromium-driver (the dashboard's browser test), libisal2 (erasure coding) and postgresql (the
# server binaries the PostgreSQL metastore tests start privately; no service is enabled), apt-installed
# only when missing and we are root; otherwise say what to install.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
[ -e /usr/include/fuse3/fuse_lowlevel.h ] || missing+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
# the mount tests run rsync (and tar, cp, dd, find, git, sqlite3: in the base image) on a mount
command -v rsync >/dev/null 2>&1 || missing+=(rsync)
# the metastore tests run a private PostgreSQL server (initdb + pg_ctl; tests/conftest.py)
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
[ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] || command -v initdb >/dev/null 2>&1 || missing+=(postgresql)
# erasure coding calls ISA-L's ec_encode_data (loomfs.ec.isal, ctypes)
ldconfig -p 2>/dev/null | grep -q 'libisal\.so\.2' || missing+=(libisal2)
# the dashboard's browser test drives Debian's chromium through chromedriver
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# the multi-host tests build network-namespace "hosts" (ip netns, veth, bridge; tc for cuts)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "+ apt-get install ${missing[*]}"
    apt-get update -qq >/dev/null
    # postgresql's package starts a cluster of its own on 5432: the tests never use it
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing system packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
    exit 2
  fi
fi
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q -e '.[test]'
exec pytest -q "$@"
