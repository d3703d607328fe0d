"""``python -m loomfs.testing.sim``: replay one seed, or run many.

    python -m loomfs.testing.sim --seed 17 --trace       # replay seed 17, print its event trace
    python -m loomfs.testing.sim --seeds 1000 --jobs 4   # seeds 0..999, 4 processes
    python -m loomfs.testing.sim --seeds 100000 --start 5000 --jobs 16 --profile soak
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from loomfs.testing.sim.config import FAULT_KINDS
from loomfs.testing.sim.runner import PROFILES, SimResult, run_many, run_seed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loomfs.testing.sim", description="LoomFS deterministic simulator")
    p.add_argument("--seed", type=int, help="run (replay) one seed")
    p.add_argument("--seeds", type=int, help="run this many seeds")
    p.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    p.add_argument("--jobs", type=int, default=1, help="processes for --seeds (0: one per CPU)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    p.add_argument("--skip", default="", help=f"fault kinds to leave out, comma-separated ({','.join(FAULT_KINDS)})")
    p.add_argument("--plant", default="", help="planted bugs to turn on, comma-separated (storage/planted.py)")
    p.add_argument("--trace", action="store_true", help="print the event trace (with --seed)")
    p.add_argument("--verbose", action="store_true", help="service logs on stderr (with --seed)")
    p.add_argument("--max-failures", type=int, default=20, help="stop printing failures after this many")
    args = p.parse_args(argv)
    skip = tuple(k for k in args.skip.split(",") if k)
    plant = tuple(k for k in args.plant.split(",") if k)
    if set(skip) - set(FAULT_KINDS):
        p.error(f"unknown fault kinds: {sorted(set(skip) - set(FAULT_KINDS))}")
    if args.seed is not None:
        if args.verbose:
            import logging

            logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        r = run_seed(args.seed, args.profile, skip=skip, plant=plant, keep_trace=True, verbose=args.verbose)
        if args.trace:
            print("\n".join(r.trace))
        print(r.summary())
        for n in r.notes:
            print(f"  note: {n}")
        print(f"  stats: {r.stats}  wall {r.wall_s:.2f}s")
        return 0 if r.ok else 1
    if not args.seeds:
        p.error("give --seed N or --seeds K")
    jobs = args.jobs or os.cpu_count() or 1
    failures: list[SimResult] = []
    started = time.perf_counter()
    done = 0

    def progress(r: SimResult) -> None:
        nonlocal done
        done += 1
        if not r.ok:
            failures.append(r)
            if len(failures) <= args.max_failures:
                print(r.summary(), flush=True)
        if done % 100 == 0 or done == args.seeds:
            rate = done / (time.perf_counter() - started)
            print(f"{done}/{args.seeds} seeds, {len(failures)} failed, {rate:.1f} seeds/s", file=sys.stderr,
                  flush=True)

    results = run_many(range(args.start, args.start + args.seeds), args.profile, jobs=jobs, skip=skip,
                       plant=plant, on_result=progress)
    elapsed = time.perf_counter() - started
    cpu_s = sum(r.cpu_s for r in results)
    slowest = max(results, key=lambda r: r.stats.get("converge_s", 0.0))
    print(f"{args.seeds} seeds in {elapsed:.1f}s ({args.seeds / elapsed:.2f} seeds/s, {jobs} jobs, "
          f"{cpu_s / max(1, len(results)):.2f} CPU-s per seed): {len(failures)} failed; slowest convergence "
          f"{slowest.stats.get('converge_s', 0.0):.2f}s (seed {slowest.seed})")
    if failures:
        print("failing seeds: " + " ".join(str(f.seed) for f in failures[:200]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
