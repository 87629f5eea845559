"""Kafila entry point: `python kafila.py ...` and PyInstaller's script."""

import multiprocessing

from kafila.cli import run_process

if __name__ == "__main__":
    multiprocessing.freeze_support()  # the one-file binary's spawned workers (bench) start here
    run_process()
