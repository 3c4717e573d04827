"""The dispatch loop: sweep, drain, recover — run by ``manage.py dispatch`` or Celery.

* **sweep** (``sweep``) — due commands go through ``retry.decide``: taken, ``→ queued`` with one
  item on the ``commands`` queue; skipped, the reason is written on the command.
* **drain** (``dispatcher``, ``senders``, ``recorder``, ``outcomes``) — sender threads
  (``ANKUSA_DISPATCH_CONCURRENCY``, at most a connector's ``max_in_flight`` or
  ``ANKUSA_DISPATCH_PER_CONNECTOR`` per connector) each win ``queued → dispatching`` for the attempt
  the sweep decided (one thread makes the starts asked for meanwhile) and send at once
  (``adapters``); a recorder thread writes each batch of outcomes in one transaction, keeping them
  (or spooling them, ``spool``) until written. Senders never touch the database: a process holds a
  few connections however many sends are in flight.
* **recover** (``recovery``) — a command ``dispatching`` past the visibility timeout becomes
  ``failed`` with no outlook; expired items go back to the queue; a ``queued`` command with no
  item gets one.

``rounds`` runs one round of the three (and the recovery timer), ``statements`` holds the hot SQL
per database vendor, ``sends`` and ``timing`` the values and pauses they share, ``heartbeat`` what
says the loop is alive. The decision itself and the queue item's payload are ``commands.lifecycle``.

Guaranteed: the loop never sends a command twice by itself (a send needs the ``queued →
dispatching`` move for that attempt; a stale or duplicate item finds it gone), with any number of
loops or Celery workers at once. Not guaranteed: the per-connector cap is per process (N processes
send up to N × the cap to one receiver); a command whose worker dies mid-send, or whose outcome
dies with its process or its disk, waits for a person even if the receiver never saw it — the
price of never sending a non-idempotent command twice. The whole account: docs/design.md, *The
dispatch loop*.
"""
