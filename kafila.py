"""Kafila entry point: `python kafila.py ...` and PyInstaller's script."""

import sys

from kafila.cli import main

if __name__ == "__main__":
    sys.exit(main())
