"""How backup and restore report progress: a few plain callbacks (the CLI draws a bar).

Callbacks run on the event loop, between awaits: they must return quickly and must not block.
``advance`` receives increments; their sums reach the totals ``start`` announced when the run
completes (a backup counts reused files as done at once; a file read twice because it changed
counts its bytes once per read, so the byte total may be exceeded).
"""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    def start(self, total_files: int, total_bytes: int) -> None:
        """The totals are known (after the scan, or after the manifest was read)."""
        ...

    def advance(self, files: int, nbytes: int) -> None:
        """``files`` more files and ``nbytes`` more bytes are done."""
        ...


class NoProgress:
    """A sink that ignores everything."""

    def start(self, total_files: int, total_bytes: int) -> None:
        pass

    def advance(self, files: int, nbytes: int) -> None:
        pass
