"""Paths no view answers, under /api/ and /hooks/, get the JSON error shape, not an HTML page."""

import pytest


@pytest.mark.parametrize("path", ["/api/v1/nothing-here/", "/hooks/../../etc/passwd", "/api/"])
def test_an_unknown_api_path_is_a_json_404(client, db, path):
    response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == "not_found"


def test_an_unknown_admin_path_keeps_the_html_404(client, db):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
