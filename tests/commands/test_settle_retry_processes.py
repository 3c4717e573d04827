"""Under a real gunicorn: a webhook whose claim settle missed the store's budget (Redis holding
writes) is committed, and once Redis runs writes again the provider's retry is answered 200
duplicate, not 409 in_flight for the rest of the claim's pending TTL."""

from __future__ import annotations

import threading

import pytest
import redis as redis_lib
from django.conf import settings

from commands.models import Delivery
from tests.commands.test_intake_processes import HeldWriteLock
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_committed_webhooks_settle_that_timed_out_lands_and_its_retry_is_a_duplicate(
    hook_source,
    start_node,
    start_private_redis,
):
    redis_server = start_private_redis()
    # The node's store is on the tests' Redis database number (tests.settings), on this server.
    url = redis_server.url.rsplit("/", 1)[0] + f"/{settings.TEST_REDIS_DB}"
    redis = redis_lib.Redis.from_url(url, socket_timeout=2)
    node = start_node(
        workers=1,
        threads=4,
        ANKUSA_STORE_SCOPE="fleet",
        ANKUSA_STORE_TIMEOUT_MS="50",
        REDIS_URL=redis_server.url,
        # The claim outlives the test; the breaker stays closed, so the retry asks Redis.
        ANKUSA_CLAIM_PENDING_TTL_MS="60000",
        ANKUSA_FLEET_BREAKER_THRESHOLD="10000",
    )
    answers = []
    with HeldWriteLock():  # the insert waits: time to make Redis hold writes before the settle
        sent = threading.Thread(target=lambda: answers.append(node.hook("evt-1")))
        sent.start()
        [claim_key] = wait_for(lambda: redis.keys("ankusa:{acme}:claim:*"), what="the claim")
        redis.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
    sent.join(30)
    status, data, _ = answers[0]
    assert status == 202
    assert redis.get(claim_key).startswith(b"p|")  # the settle missed its 50 ms

    redis.execute_command("CLIENT", "UNPAUSE")
    wait_for(lambda: redis.get(claim_key).startswith(b"c|"), timeout=10, what="the settle to land")
    assert node.hook("evt-1")[:2] == (200, {"status": "duplicate", "id": data["id"]})
    assert Delivery.objects.count() == 1
