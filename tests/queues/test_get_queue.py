"""``get_queue(name)``: the backend the settings choose for each queue name."""

from __future__ import annotations

from datetime import timedelta

import pytest

from queues.backends import get_queue
from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO


def test_the_default_backend_is_the_database(settings):
    settings.ANKUSA_QUEUE_BACKEND = "database"
    settings.ANKUSA_QUEUE_BACKENDS = {}
    assert isinstance(get_queue("commands"), DatabaseFIFO)


def test_a_per_queue_backend_overrides_the_default(settings):
    settings.ANKUSA_QUEUE_BACKEND = "database"
    settings.ANKUSA_QUEUE_BACKENDS = {"commands": "redis"}
    assert isinstance(get_queue("commands"), RedisFIFO)
    assert isinstance(get_queue("mail"), DatabaseFIFO)


def test_the_site_default_applies_to_every_queue_without_an_override(settings):
    settings.ANKUSA_QUEUE_BACKEND = "redis"
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "database"}
    assert isinstance(get_queue("commands"), RedisFIFO)
    assert isinstance(get_queue("mail"), DatabaseFIFO)


def test_the_queue_takes_the_requeue_limit_and_visibility_timeout_from_settings(settings):
    settings.ANKUSA_QUEUE_REQUEUE_LIMIT = 9
    settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S = 600
    queue = get_queue("commands")
    assert (queue.name, queue.requeue_limit, queue.visibility_timeout) == (
        "commands",
        9,
        timedelta(minutes=10),
    )


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="Unknown queue backend"):
        get_queue("commands", backend="kafka")
