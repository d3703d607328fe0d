#!/usr/bin/env bash
# A throwaway MooseFS on this machine, for `loomfs bench --compare` (development only: CI and
# scripts/test.sh never run it).
#
#   bash scripts/moosefs_local.sh start [DIR] [MOUNTPOINT]   # default /tmp/mfs-local /mnt/mfs
#   bash scripts/moosefs_local.sh stop  [DIR] [MOUNTPOINT]
#
# Shape: one master + 2 chunk servers (ports 9419-9421, 9422-9423), goal 2 on the
# whole tree (the same 2 copies as a 2-replica LoomFS chain), data under DIR, a FUSE mount
# (mfsmount) at MOUNTPOINT. Daemons run at nice 0 (the packaged default is -19, which would give
# MooseFS an unfair share of a shared machine). HDD_FSYNC_BEFORE_CLOSE=1 so that a chunk server
# flushes a chunk before it closes it, as LoomFS's durable writes do; the bench fsyncs the
# compared files before close either way.
# MooseFS refuses 127.0.0.1 for the chunk server -> master link ("use ip address of network
# controller"), and it keeps only one copy of a chunk per IP address, so the master uses 10.254.254.1
# and chunk server i uses 10.254.254.(1+i): extra addresses this script puts on the loopback
# interface (and removes at stop); packets to them never leave the host.
# Needs the Debian packages: apt-get install -y moosefs-master moosefs-chunkserver moosefs-client moosefs-cli
set -euo pipefail

cmd=${1:-}
dir=${2:-/tmp/mfs-local}
mnt=${3:-/mnt/mfs}
ip=10.254.254.1
net=10.254.254

need() {
    for bin in mfsmaster mfschunkserver mfsmount mfscli; do
        command -v "$bin" >/dev/null || {
            echo "missing $bin: apt-get install -y moosefs-master moosefs-chunkserver moosefs-client moosefs-cli" >&2
            exit 1
        }
    done
}

write_configs() {
    mkdir -p "$dir/master" "$dir/cs1/data" "$dir/cs1/hdd" "$dir/cs2/data" "$dir/cs2/hdd"
    cat >"$dir/master/mfsexports.cfg" <<EOF
$ip / rw,alldirs,admin,maproot=0:0
$ip . rw
EOF
    : >"$dir/master/mfstopology.cfg"
    cat >"$dir/master/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
NICE_LEVEL = 0
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/master/mfsexports.cfg
TOPOLOGY_FILENAME = $dir/master/mfstopology.cfg
MATOML_LISTEN_HOST = $ip
MATOCS_LISTEN_HOST = $ip
MATOCL_LISTEN_HOST = $ip
REPLICATIONS_DELAY_INIT = 0
EOF
    [ -e "$dir/master/metadata.mfs" ] || cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
    local i
    for i in 1 2; do
        echo "$dir/cs$i/hdd" >"$dir/cs$i/mfshdd.cfg"
        cat >"$dir/cs$i/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
NICE_LEVEL = 0
DATA_PATH = $dir/cs$i/data
HDD_CONF_FILENAME = $dir/cs$i/mfshdd.cfg
HDD_FSYNC_BEFORE_CLOSE = 1
MASTER_HOST = $ip
BIND_HOST = $net.$((1 + i))
CSSERV_LISTEN_HOST = $net.$((1 + i))
CSSERV_LISTEN_PORT = $((9421 + i))
EOF
    done
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "timed out waiting for $what" >&2
            exit 1
        fi
        sleep 0.5
    done
}

chunkservers_up() {
    [ "$(mfscli -H "$ip" -P 9421 -SCS -s '|' 2>/dev/null | grep -c "$net\.")" -ge 2 ]
}

start() {
    need
    local a
    for a in 1 2 3; do
        ip addr show dev lo | grep -q "inet $net.$a/" || ip addr add "$net.$a/32" dev lo
    done
    write_configs
    mfsmaster -c "$dir/master/mfsmaster.cfg" start
    mfschunkserver -c "$dir/cs1/mfschunkserver.cfg" start
    mfschunkserver -c "$dir/cs2/mfschunkserver.cfg" start
    wait_for 60 "2 chunk servers to register" chunkservers_up
    mkdir -p "$mnt"
    mfsmount "$mnt" -H "$ip" -P 9421
    wait_for 30 "the mount at $mnt" mountpoint -q "$mnt"
    mfssetgoal -r 2 "$mnt" >/dev/null
    # deleted files would otherwise sit in MooseFS's trash for 24 h (a 1 GiB bench left 15 GB)
    mfssettrashtime -r 0 "$mnt" >/dev/null
    echo "MooseFS up: master $ip:9421, 2 chunk servers, goal 2, mounted at $mnt (data in $dir)"
}

stop() {
    if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
    local i
    for i in 1 2; do
        [ -e "$dir/cs$i/mfschunkserver.cfg" ] && mfschunkserver -c "$dir/cs$i/mfschunkserver.cfg" stop || true
    done
    [ -e "$dir/master/mfsmaster.cfg" ] && mfsmaster -c "$dir/master/mfsmaster.cfg" stop || true
    for i in 1 2 3; do ip addr del "$net.$i/32" dev lo 2>/dev/null || true; done
    echo "MooseFS stopped (data left in $dir; rm -rf it to start empty)"
}

case "$cmd" in
start) start ;;
stop) stop ;;
*)
    echo "usage: $0 start|stop [DIR] [MOUNTPOINT]" >&2
    exit 2
    ;;
esac
