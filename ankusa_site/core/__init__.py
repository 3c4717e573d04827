"""The bottom layer of the project: what every app may import, and which imports no app.

Logs, metric objects and their registry, JSON answers and probes, the admin and API base classes,
the strict-JSON rule, settings helpers (``env``), private files, prepared statements, the
``ANKUSA_STOCK_DJANGO`` switch and the long-lived processes' freeze of what they loaded. The
project shell around it (``ankusa_site`` itself: settings, urls, wsgi, checks, the request
handler, gunicorn's configuration, the management commands) imports the apps; nothing here does
(``tests/site/test_imports.py`` holds both rules).
"""
