"""Bursts of CPU on every core, to see how the gateway keeps its latency objective on a host that stalls.

Every 1 to 3 s (at random), one process per core spins for 80 to 200 ms. Run it next to a benchmark::

    .venv/bin/python bench/disturb.py --seconds 400 &
    .venv/bin/python bench/efficiency.py --models digits --rates digits=1500 --knobs 0,1 --rounds 3

About 0.1 cores in all, so ``efficiency.py`` does not mark its cells disturbed (``--disturbed-cores`` 0.3).
The spinners stop with this process, or after ``--seconds``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time


def spin(seed: int, parent: int, until: float) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until and os.getppid() == parent:
        time.sleep(rng.uniform(1.0, 3.0))
        end = time.monotonic() + rng.uniform(0.08, 0.2)
        while time.monotonic() < end:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to run (600)")
    parser.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="spinning processes (all cores)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    until = time.monotonic() + args.seconds
    workers = [
        mp.Process(target=spin, args=(args.seed + i, os.getpid(), until), daemon=True)
        for i in range(args.cores)
    ]
    for w in workers:
        w.start()
    try:
        for w in workers:
            w.join()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
