"""What a webhook would cost without waiting for Redis or PostgreSQL: the intake's round trips
answered in the process, from a recording of real ones, for the benchmarks' what-if figures.

``install(waits)`` (``replaying(waits)`` while inside) patches the fleet store's round trip
(``limits.store.redis._Pool.run``: the claim, and the settles riding on it or sent together) and/or
the intake's statement (``commands.intake.write.execute_prepared``): the first call of each shape
(the scripts it runs; for the statement, any) goes to the server and its answer is kept, every later
one gets that answer without a socket. The Python around them (building the call, reading the
answer) still runs. Answers are kept for the process's life, so a warm-up records them once.
A replayed statement stores nothing: every webhook answered from it names the recorded delivery.
``bench/gunicorn_replayed.py`` turns it on in each gunicorn worker (``BENCH_REPLAY``).
Bench-only: nothing of the product imports it.
"""

from __future__ import annotations

import contextlib

WAITS = ("store", "statement")
_answers: dict = {}


def _shape(commands: list[bytes]) -> tuple:
    # Each command is a packed EVALSHA: the fifth line of the RESP array is the script's SHA.
    return tuple(command.split(b"\r\n")[4] for command in commands)


def install(waits=WAITS):
    """Answer the round trips named in ``waits`` (of :data:`WAITS`) from the recording from now
    on; returns what undoes it."""
    from commands.intake import write as intake
    from limits.store import redis as redis_store

    unknown = set(waits) - set(WAITS)
    if unknown:
        raise ValueError(f"no such wait: {', '.join(sorted(unknown))} (choose from {', '.join(WAITS)})")
    run, execute = redis_store._Pool.run, intake.execute_prepared

    def replayed_run(pool, commands, deadline):
        key = _shape(commands)
        if key not in _answers:
            _answers[key] = run(pool, commands, deadline)
        return list(_answers[key])

    def replayed_execute(db, sql, params):
        if sql not in _answers:
            _answers[sql] = execute(db, sql, params)
        return _answers[sql]

    if "store" in waits:
        redis_store._Pool.run = replayed_run
    if "statement" in waits:
        intake.execute_prepared = replayed_execute

    def undo() -> None:
        redis_store._Pool.run, intake.execute_prepared = run, execute

    return undo


@contextlib.contextmanager
def replaying(waits=WAITS):
    """:func:`install` while inside."""
    undo = install(waits)
    try:
        yield
    finally:
        undo()
