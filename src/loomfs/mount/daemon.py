"""Mount lifetime: serve in the foreground, start in the background (pid and log files),
unmount cleanly on SIGTERM/SIGINT, and clear a mountpoint left stuck by a killed daemon."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from loomfs.mount.options import MountOptions

logger = logging.getLogger(__name__)
READY_WAIT_S = 30.0
UMOUNT_WAIT_S = 10.0


def state_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    d = Path(base) / f"loomfs-mount-{os.getuid()}"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def state_files(mountpoint: str) -> tuple[Path, Path]:
    """(pid file, log file) of the mount at ``mountpoint``."""
    mp = os.path.realpath(mountpoint)
    tag = os.path.basename(mp) + "-" + hashlib.sha1(mp.encode()).hexdigest()[:10]
    d = state_dir()
    return d / f"{tag}.pid", d / f"{tag}.log"


def is_mounted(mountpoint: str) -> bool:
    mp = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].replace("\\040", " ") == mp for line in f if len(line.split()) > 1)


def clear_stale(mountpoint: str) -> bool:
    """A mountpoint whose daemon died (ENOTCONN) is lazily unmounted; True if it was."""
    try:
        os.stat(mountpoint)
        return False
    except OSError as exc:
        if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            raise
    logger.info("%s: stale mount (daemon gone); unmounting it", mountpoint)
    subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False, capture_output=True)
    return True


def _read_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_background(argv: list[str], mountpoint: str) -> int:
    """Re-run ``loomfs mount ... --foreground`` detached; return once it serves."""
    pid_file, log_file = state_files(mountpoint)
    cmd = [sys.executable, "-m", "loomfs.cli.main", *argv, "--foreground", "--pid-file", str(pid_file)]
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace")[-2000:]
            raise OSError(errno.EIO, f"mount daemon exited ({proc.returncode}); log {log_file}:\n{tail}", mountpoint)
        if is_mounted(mountpoint) and _read_pid(pid_file) == proc.pid:
            try:
                os.stat(mountpoint)  # answered by the daemon: it serves
            except OSError:
                pass
            else:
                if proc.poll() is None:
                    return proc.pid
        time.sleep(0.05)
    proc.terminate()
    raise OSError(errno.ETIMEDOUT, f"mount not ready after {READY_WAIT_S:.0f} s; log {log_file}", mountpoint)


def umount(mountpoint: str, *, lazy: bool = False) -> None:
    """Unmount and wait for the daemon to finish (its open files closed)."""
    pid_file, _ = state_files(mountpoint)
    pid = _read_pid(pid_file)
    if is_mounted(mountpoint):
        args = ["fusermount3", "-u", *(["-z"] if lazy else []), mountpoint]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(errno.EBUSY, r.stderr.strip() or "fusermount3 failed", mountpoint)
    elif pid is None:
        raise OSError(errno.EINVAL, "not mounted", mountpoint)
    deadline = time.monotonic() + UMOUNT_WAIT_S
    while pid is not None and _read_pid(pid_file) == pid:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGTERM)
            deadline += UMOUNT_WAIT_S
        time.sleep(0.05)


def serve(target: str, mountpoint: str, options: MountOptions, pid_file: str | None = None) -> None:
    """Mount and serve until unmounted or SIGTERM/SIGINT (then unmount)."""
    import pyfuse3
    import pyfuse3.asyncio

    import loomfs
    from loomfs.mount.ops import LoomOperations

    pyfuse3.asyncio.enable()
    mountpoint = os.path.realpath(mountpoint)
    clear_stale(mountpoint)
    fs = loomfs.connect(target, consistency=options.consistency)
    ops = LoomOperations(fs.client, fs.loop, options)
    # the bdi read-ahead (the size of read requests) is set once INIT is answered: the reply
    # lowers it to what the kernel offered when it mounted (128 KiB), so setting it any
    # earlier is undone and every read stays a 128 KiB request
    ops.after_init = lambda: _set_read_ahead(mountpoint, options.read_ahead_kb)
    pyfuse3.init(ops, mountpoint, options.fuse_options(f"loomfs:{target}"))
    mount_locks = None
    if options.locks == "cluster":  # between init() and main(): libfuse asks for locks at INIT
        from loomfs.client.locks import meta_has_locks
        from loomfs.mount.locks import install

        if fs.run(meta_has_locks(fs.client)):
            mount_locks = install(ops, options.lock_lease_s)
            ops.mount_locks = mount_locks
        else:
            logger.warning("locks stay local to this mount: the meta servers do not keep locks (older LoomFS)")
    if options.loop == "shared":
        fuse_loop = fs.loop
        done = asyncio.run_coroutine_threadsafe(pyfuse3.main(max_tasks=options.max_tasks), fuse_loop)

        def wait() -> None:
            while not done.done():
                with contextlib.suppress(TimeoutError):
                    done.result(0.5)
            done.result()
    else:
        fuse_loop = asyncio.new_event_loop()
        result: list[BaseException] = []

        def run() -> None:
            try:
                fuse_loop.run_until_complete(pyfuse3.main(max_tasks=options.max_tasks))
            except BaseException as exc:  # handed to the main thread
                result.append(exc)

        t = threading.Thread(target=run, name="loomfs-fuse", daemon=True)
        t.start()

        def wait() -> None:
            while t.is_alive():
                t.join(0.5)
            if result:
                raise result[0]

    def stop(signum: int, _frame: object) -> None:
        logger.info("signal %d: unmounting %s", signum, mountpoint)
        fuse_loop.call_soon_threadsafe(pyfuse3.terminate)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if pid_file:
        Path(pid_file).write_text(f"{os.getpid()}\n")
    logger.info("serving %s at %s (%r)", target, mountpoint, options)
    try:
        wait()
    finally:
        if mount_locks is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(mount_locks.close(), fs.loop).result(UMOUNT_WAIT_S)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(ops.close_all(), fs.loop).result(UMOUNT_WAIT_S)
        pyfuse3.close(unmount=True)
        fs.close()
        if pid_file:
            with contextlib.suppress(OSError):
                os.unlink(pid_file)
        logger.info("unmounted %s", mountpoint)


def _set_read_ahead(mountpoint: str, kb: int) -> None:
    """1 MiB read requests need the bdi's read-ahead raised (FUSE's default is 128 KiB).
    Sync sysfs write on the loop: a few microseconds, once."""
    if kb <= 0:
        return
    try:
        with open("/proc/self/mountinfo") as f:
            devs = [line.split()[2] for line in f if line.split()[4] == mountpoint]
        if not devs:
            raise OSError(errno.ENOENT, "not in mountinfo", mountpoint)
        Path(f"/sys/class/bdi/{devs[-1]}/read_ahead_kb").write_text(str(kb))
        logger.info("read_ahead_kb of bdi %s set to %d", devs[-1], kb)
    except OSError as exc:
        logger.info("read_ahead_kb not set (%s); reads stay in 128 KiB requests", exc)
