"""``ANKUSA_STOCK_DJANGO`` (``ankusa_site.core.stock``): which fast paths turn back to stock Django."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from ankusa_site.core import stock


@pytest.mark.parametrize("value", [None, "", "0", "off", "false"])
def test_unset_or_off_keeps_every_fast_path(value):
    assert stock.parse(value) == frozenset()


@pytest.mark.parametrize("value", ["1", "all", "yes", "ALL"])
def test_one_or_all_turns_every_layer_back_to_stock(value):
    assert stock.parse(value) == {"handler", "prepared", "sql", "backend"}


def test_a_list_names_the_layers_that_turn_back():
    assert stock.parse(" handler, sql ") == {"handler", "sql"}


def test_an_unknown_layer_fails_the_boot_naming_it():
    with pytest.raises(ImproperlyConfigured, match="ANKUSA_STOCK_DJANGO='handler,orm': orm is no layer"):
        stock.parse("handler,orm")


def test_the_backend_layer_swaps_the_sites_engines_for_djangos():
    postgres = {"ENGINE": "ankusa_site.postgresql", "NAME": "x"}
    assert stock.stock_engine(postgres, frozenset({"backend"}))["ENGINE"] == "django.db.backends.postgresql"
    assert stock.stock_engine(postgres, frozenset({"sql"})) == postgres
    lite = {"ENGINE": "ankusa_site.sqlite3", "NAME": "x"}
    assert stock.stock_engine(lite, frozenset({"backend"}))["ENGINE"] == "django.db.backends.sqlite3"


def test_the_stock_handler_takes_webhooks_djangos_way(settings):
    settings.ANKUSA_STOCK_DJANGO = frozenset({"handler"})
    from django.test.client import ClientHandler

    from tests.conftest import SiteClientHandler

    handler = SiteClientHandler()
    handler.load_middleware()
    plain = ClientHandler()
    plain.load_middleware()
    # Django's own chain (the resolver inside), not the shortcut's either-or function.
    assert handler._middleware_chain.__qualname__ == plain._middleware_chain.__qualname__
