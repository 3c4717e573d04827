#!/usr/bin/env python
import os
import sys
from pathlib import Path

# Commands that answer requests: they keep needing SECRET_KEY (or DEBUG=1) as the settings say.
SERVING = {"serve", "runserver"}


def use_local_secret_key(argv: list[str]) -> None:
    """Right after ``make run`` (DEBUG=1, which writes a generated key to ``var/secret_key``), a
    ``manage.py`` command in the same shell works with no variable set: with no SECRET_KEY in the
    environment, it uses that key. Safe because the file only exists where a local DEBUG site made
    it (random, mode 0600, its owner's alone), a SECRET_KEY that is set always wins, the command
    runs with DEBUG off, and a serving command (gunicorn through ``serve``, ``runserver``) is
    never given it: a site still refuses to start without a key of its own. It is the key of the
    very site the command works on, so what it signs or fingerprints agrees with that site."""
    if os.environ.get("SECRET_KEY") or (len(argv) > 1 and argv[1] in SERVING):
        return
    var_dir = Path(os.environ.get("ANKUSA_VAR_DIR") or Path(__file__).resolve().parent / "var")
    try:
        key = (var_dir / "secret_key").read_text().strip()
    except OSError:
        return  # no local key: the settings say what to set
    if key:
        os.environ["SECRET_KEY"] = key


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
    use_local_secret_key(sys.argv)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
