"""``env_networks``: CIDRs from the environment, a bad one failing the boot naming the variable."""

from __future__ import annotations

from ipaddress import ip_network

import pytest
from django.core.exceptions import ImproperlyConfigured

from ankusa_site.core.env import env_networks

NAME = "ANKUSA_CONNECTOR_ALLOWED_NETWORKS"


def test_networks_are_read_comma_separated_a_bare_address_being_one_host():
    environ = {NAME: " 10.1.0.0/16, ::1 ,,fd00::/8"}
    assert env_networks(NAME, [], environ=environ) == (
        ip_network("10.1.0.0/16"),
        ip_network("::1/128"),
        ip_network("fd00::/8"),
    )


def test_unset_gives_the_default_and_empty_gives_none():
    assert env_networks(NAME, ["127.0.0.0/8"], environ={}) == (ip_network("127.0.0.0/8"),)
    assert env_networks(NAME, ["127.0.0.0/8"], environ={NAME: ""}) == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10.1.2.3/16", "'10.1.2.3/16' is not a network (10.1.2.3/16 has host bits set)."),
        (
            "10.0.0.0/33",
            "'10.0.0.0/33' is not a network ('10.0.0.0/33' does not appear to be an IPv4 or IPv6 network).",
        ),
        (
            "intranet",
            "'intranet' is not a network ('intranet' does not appear to be an IPv4 or IPv6 network).",
        ),
    ],
)
def test_a_value_that_is_no_network_fails_naming_the_variable(value, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        env_networks(NAME, [], environ={NAME: value})
    assert str(raised.value) == f"{NAME}: {message}"
