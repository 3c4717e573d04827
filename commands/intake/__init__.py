"""Intake: the front doors that turn an authenticated request into stored commands, in the order a
request meets them.

* ``hooks`` — ``POST /hooks/<tenant>/<source>/``, a provider's webhook; with ``signatures`` (the
  source's verifier), ``headers`` (the request headers a delivery keeps) and ``event_keys`` (the
  key a source dedupes its events on).
* ``rest`` — ``POST /api/v1/commands/``, a REST submission.
* ``http`` — what both doors share at the HTTP level: the body read under a limit, the answer to an
  outcome that stored nothing, the metrics (the strict JSON rule: ``ankusa_site.core.strict_json``).
* ``arrival`` — what both doors hand to ``submit`` (an ``Arrival``) and the ``Outcome`` it answers.
* ``submit`` — the one domain function both call: quota and dedupe claim, one write, the claim settled.
* ``write`` — that one write (the delivery, its commands, their queue items) in one transaction.

A command born ``approved`` gets the sweep's own decision and queue item at birth
(``commands.lifecycle``); nothing here imports ``commands.dispatch``.
"""
