"""The private PostgreSQL cluster that fault tests restart: it comes back on the same port."""

import psycopg
import pytest


def test_private_postgres_answers_again_after_an_immediate_restart(private_postgres):
    url = private_postgres.create_database("faults")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        private_postgres.restart("immediate")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
