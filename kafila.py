"""Kafila entry point: `python kafila.py ...` and PyInstaller's script."""

import multiprocessing
import sys

from kafila.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # the one-file binary's spawned workers (bench) start here
    sys.exit(main())
