"""The checkpoint benchmark's rows (``Result``) from the phases' seconds and costs, each held
against its limit of the same run, and the issue's targets for them (``target_check``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loomfs.bench.checkpoint_phases import RANKS, THREADS
from loomfs.bench.workloads import Result

TARGETS = {"save": 0.8, "load": 1.0}  # of the local figure


def row_names() -> list[str]:
    """The rows ``run_checkpoint`` returns for a LoomFS target, in order."""
    return ["ckpt_save_1r", "ckpt_load_1r", "ckpt_local_save", "ckpt_local_load",
            "ckpt_disk_save_1r", "ckpt_disk_local_save",
            "ckpt_save_2r", "ckpt_load_2r", "ckpt_local_save_2r", "ckpt_local_load_2r",
            "ckpt_disk_save_2r", "ckpt_disk_local_save_2r",
            "ckpt_block_sync_s", "ckpt_block_async_s", "ckpt_staging_copy_s"]


def rows(one: Mapping[str, float], blk: Mapping[str, float], two: Mapping[str, float], nbytes: int,
         tensors: int, lim: Mapping[str, float]) -> list[Result]:
    """The rows (``row_names``) from the 1-rank (``one``), blocked-time (``blk``) and 2-rank
    (``two``) phases' figures, against the limits ``lim`` measured in the same run."""
    out: list[Result] = []
    for ranks, r in ((1, one), (RANKS, two)):
        total = int(r.get("bytes", nbytes))
        sfx = "" if ranks == 1 else f"_{ranks}r"
        base_extra = {"bytes": total, "tensors": tensors, "ranks": ranks, "threads": THREADS}
        local_vals = {}
        for op, disk_key in (("save", "disk_fsync_write_Bps"), ("load", "disk_fsync_read_Bps")):
            v = total / r[f"local_{op}_s"]
            local_vals[op] = v
            out.append(Result(f"ckpt_local_{op}{sfx}", v, "B/s", "local disk " + ("write+fsync" if op == "save" else "read"),
                              lim[disk_key], {**base_extra, "seconds": r[f"local_{op}_s"], "MBps": v / 1e6,
                                                  "quiet_wait_s": r.get(f"local_{op}_quiet_s", 0.0)}))
        for op in ("save", "load"):
            v = total / r[f"{op}_s"]
            out.append(Result(f"ckpt_{op}_{ranks}r", v, "B/s", f"local DCP {op} {ranks}r", local_vals[op],
                              {**base_extra, "seconds": r[f"{op}_s"], "MBps": v / 1e6, "target_ratio": TARGETS[op],
                               "quiet_wait_s": r.get(f"{op}_quiet_s", 0.0)}))
        out += _disk_rows(r, total, ranks, sfx, lim)
    out.sort(key=lambda res: row_names().index(res.name))
    stage = blk["staging_copy_s"]
    mem_s = nbytes / lim["memcpy_Bps"]
    extra = {"bytes": nbytes, "tensors": tensors, "async_total_s": blk["async_total_s"],
             "async_first_s": blk["async_first_s"], "async_first_total_s": blk["async_first_total_s"]}
    out.append(Result("ckpt_block_sync_s", blk["sync_s"], "s", "staging copy", stage, extra))
    warm_s = blk.get("staging_copy_warm_s", 0.0)
    out.append(Result("ckpt_block_async_s", blk["async_s"], "s", "staging copy", stage,
                      {**extra, "target_ratio_max": 1.0, "staging_copy_warm_s": warm_s,
                       "vs_warm_copy": blk["async_s"] / warm_s if warm_s else 0.0}))
    out.append(Result("ckpt_staging_copy_s", stage, "s", "memcpy", mem_s, extra))
    return out


def _disk_rows(r: Mapping[str, float], total: int, ranks: int, sfx: str, lim: Mapping[str, float]) -> list[Result]:
    """What each side of a save wrote to the disk, as bytes/s against the disk's fsync'd
    write limit: the local writer writes one copy, LoomFS one per replica (the storage
    processes' ``write_bytes``), all to the same disk here. ``copies`` says how many; the
    extra ``disk_bound_Bps`` is the save rate the limit allows at that many copies
    (``disk_direct_bound_Bps``: the same for the disk's O_DIRECT write rate), and
    ``cpu_s_per_GiB`` what the processes spent per GiB saved (for LoomFS: the storage
    processes; ``client_cpu_s_per_GiB`` the saving ranks)."""
    out = []
    gib = total / (1 << 30)
    fsync_w = lim["disk_fsync_write_Bps"]
    for name, prefix, who in ((f"ckpt_disk_save_{ranks}r", "", "storage"),
                              (f"ckpt_disk_local_save{sfx}", "local_", "client")):
        secs = r[f"{prefix}save_s"]
        disk = float(r.get(f"{prefix}{who}_disk_bytes", 0.0))
        copies = disk / total if total else 0.0
        extra = {"bytes": total, "ranks": ranks, "disk_bytes": disk, "copies": copies, "seconds": secs,
                 "MBps": disk / secs / 1e6, "disk_bound_Bps": fsync_w / copies if copies else 0.0,
                 "save_vs_disk_bound": (total / secs) / (fsync_w / copies) if copies else 0.0,
                 # the O_DIRECT write rate of the same disk (how LoomFS writes chunks) per copy
                 "disk_direct_bound_Bps": lim.get("disk_write_Bps", 0.0) / copies if copies else 0.0,
                 "cpu_s_per_GiB": r.get(f"{prefix}{who}_cpu_s", 0.0) / gib if gib else 0.0,
                 "client_cpu_s_per_GiB": r.get(f"{prefix}client_cpu_s", 0.0) / gib if gib else 0.0}
        out.append(Result(name, disk / secs, "B/s", "local disk write+fsync", fsync_w, extra))
    return out


def target_check(row: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The issue's target for a ``ckpt_`` row as (text, met), or None where it sets none."""
    ratio = row.get("ratio")
    e = row["extra"]
    if "target_ratio" in e:
        return f">= {e['target_ratio']:g} of local", ratio is not None and ratio >= e["target_ratio"]
    if "target_ratio_max" in e:
        return "<= staging copy", ratio is not None and ratio <= e["target_ratio_max"]
    return None
