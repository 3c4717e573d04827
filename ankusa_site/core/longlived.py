"""A long-lived process's start-up objects, out of the cyclic collector's sight.

:func:`freeze_startup` collects what loading left as garbage, then freezes every object still alive
(``gc.freeze``). The modules, models, settings and URL resolver a worker or the dispatch loop loads
live as long as the process does, yet each collection of the oldest generation walks them all
again, holding the GIL meanwhile: every thread of the process stops for it (bench/README.md has
the figures). Garbage made afterwards is collected as before. Frozen objects are never collected,
so it is called once, when start-up is done, in a process of its own (never a caller's).
"""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    gc.collect()  # what loading left as garbage goes now, not frozen with the rest
    gc.freeze()
