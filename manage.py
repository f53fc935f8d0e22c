#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")
    # OpenBLAS reads this once, when numpy is first imported, and a command's system checks already
    # import it (the URLconf reaches inference.config through tritonclient): set inside `serve` it came
    # too late, and at the batch sizes of a loaded gateway OpenBLAS handed half of each product to a
    # worker thread that then spun between calls (measured: 543 -> 290 µs of CPU a request at c=32).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
