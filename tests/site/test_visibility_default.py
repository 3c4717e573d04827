"""The queue's visibility timeout follows the longest send unless it is set: a killed dispatcher's
work comes back a whole send and a margin after its claim, not after a fixed five minutes."""

import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

SHOW = "from django.conf import settings; print(settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)"


def visibility(tmp_path, **env: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {SHOW}"],
        cwd=settings.BASE_DIR,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "ankusa_site.settings", "DEBUG": "1",
             "ANKUSA_VAR_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def test_the_default_visibility_timeout_is_a_whole_send_and_ten_seconds(tmp_path):
    assert visibility(tmp_path) == 5 + 30 + 10
    assert visibility(tmp_path, ANKUSA_HTTP_CONNECT_TIMEOUT_S="2.5", ANKUSA_HTTP_READ_TIMEOUT_S="60") == 73


def test_a_visibility_timeout_set_is_kept(tmp_path):
    assert visibility(tmp_path, ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S="300") == 300
