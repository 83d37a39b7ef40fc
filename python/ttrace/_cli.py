"""Console scripts of the ttrace package: ``ttrace`` and ``ttraced`` run the executables
shipped inside the package (``ttrace run`` then finds ``libttrace.so`` next to itself, and
the library finds ``ttraced`` next to itself)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

_BIN = Path(__file__).resolve().parent / "_bin"


def _exec(name: str) -> None:
    exe = _BIN / name
    if not exe.is_file():
        sys.exit(f"ttrace: {exe} is missing from the installed package")
    mode = exe.stat().st_mode
    if not mode & stat.S_IXUSR:
        # Some installers drop the executable bit of package data.
        os.chmod(exe, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.execv(exe, [name, *sys.argv[1:]])


def ttrace() -> None:
    """``ttrace ...``: the CLI."""
    _exec("ttrace")


def ttraced() -> None:
    """``ttraced ...``: the collector."""
    _exec("ttraced")
