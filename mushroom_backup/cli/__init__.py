"""The command line: click commands that parse, call, print, and map errors to exit codes.

Exit codes (the contract users script against, listed in the README):
0 ok, 1 error, 2 usage, 3 lease held by another instance, 4 lease lost or fence closed during
the run, 5 integrity failure.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
