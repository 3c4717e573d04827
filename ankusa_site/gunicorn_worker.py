"""gunicorn's threaded worker, taking a new connection only while one of its threads is free.

gunicorn's own ``gthread`` worker accepts every connection it can while any of its threads runs,
so the first worker to wake can take all of a burst of new connections (a client's keep-alive
pool, many clients at once) and serve them as many at a time as it has threads while the other
workers idle (benoitc/gunicorn#3433). This one stops listening while every thread has a
connection, so a new connection goes to a worker with a free thread, or waits in the listen queue
until one is free. Not changed: a connection already kept alive by a busy worker stays with it,
and a new connection holds its thread until its first request, for at most gthread's own wait.
It extends gthread's ``enqueue_req``, ``finish_request`` and ``set_accept_enabled`` (gunicorn is
pinned in requirements.txt; tests/site/test_gunicorn_worker.py holds the behaviour).
"""

from __future__ import annotations

from gunicorn.workers import gthread


class ThreadWorker(gthread.ThreadWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.busy = 0  # connections handed to the thread pool, not yet finished (main thread only)

    def enqueue_req(self, conn):
        self.busy += 1
        super().enqueue_req(conn)
        if self.busy >= self.cfg.threads:
            self.set_accept_enabled(False)

    def finish_request(self, conn, fs):
        self.busy -= 1
        super().finish_request(conn, fs)

    def set_accept_enabled(self, enabled):
        # run() asks for accepting again at each turn of its loop while it has room for more
        # connections: it is granted once a thread is free.
        super().set_accept_enabled(enabled and self.busy < self.cfg.threads)
