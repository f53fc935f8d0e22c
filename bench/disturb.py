"""Bursts of CPU, to see how the gateway keeps its latency objective on a host that stalls.

One process per core (``--cores``) sleeps 1 to 3 s (at random), then spins for 80 to 200 ms, again and
again; the processes are independent, so bursts overlap only by chance. Run it next to a benchmark::

    .venv/bin/python bench/disturb.py --seconds 400 &
    .venv/bin/python bench/efficiency.py --models digits --rates digits=1500 --knobs 0,1 --rounds 3

Each process uses about 0.07 of a core: on 2 cores about 0.13 in all, under what ``efficiency.py`` marks
disturbed (``--disturbed-cores`` 0.3); on more cores pass ``--cores 2`` or raise that threshold.
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
