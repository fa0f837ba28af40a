"""Profile one mushroom-backup command with cProfile in every thread that does its work.

``python -m cProfile`` sees only the main thread, where mushroom-backup mostly waits on its
event loop; the reading, hashing, compression and decoding happen in ``ThreadPoolExecutor``
workers (``asyncio.to_thread`` and ``run_in_executor`` use them too). This wraps each worker's
work items in a per-thread profiler and merges everything into one stats file at exit.

Usage (environment as for the CLI, e.g. AWS_ENDPOINT_URL and credentials)::

    python bench/profile_cli.py OUT.prof backup now --store s3://bucket/prefix --source DIR
    python -c "import pstats; pstats.Stats('OUT.prof').sort_stats('tottime').print_stats(25)"

Caveat: times are wall-clock per thread, so a C call that releases the GIL is charged with the
wait to take it back; compare calls' shares, not their absolute seconds, and expect the profiler
to slow Python-heavy code down.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread as pool_thread
import cProfile
import pstats
import runpy
import sys
import threading
from typing import Any

_profiles: list[cProfile.Profile] = []
_local = threading.local()
_original_run = pool_thread._WorkItem.run


def _profiled_run(self: Any) -> None:
    profile: cProfile.Profile | None = getattr(_local, "profile", None)
    if profile is None:
        profile = _local.profile = cProfile.Profile()
        _profiles.append(profile)
    profile.enable()
    try:
        _original_run(self)
    finally:
        profile.disable()


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    pool_thread._WorkItem.run = _profiled_run  # type: ignore[method-assign]
    main_profile = cProfile.Profile()

    def dump() -> None:
        main_profile.disable()
        stats = pstats.Stats(main_profile)
        for profile in _profiles:
            stats.add(profile)
        stats.dump_stats(out)
        print(f"profile: wrote {out}", file=sys.stderr)

    atexit.register(dump)
    sys.argv = ["mushroom-backup", *sys.argv[2:]]
    main_profile.enable()
    runpy.run_module("mushroom_backup", run_name="__main__")


if __name__ == "__main__":
    main()
