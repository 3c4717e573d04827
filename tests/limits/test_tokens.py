import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from limits import tokens
from limits.authentication import ApiTokenAuthentication, TenantClient, tenant_of
from limits.models import ApiToken, Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme")


@pytest.fixture
def staff():
    return get_user_model().objects.create_user("ops", password="x", is_staff=True)


def authenticate(header: str | bytes):
    request = RequestFactory().get("/api/v1/", HTTP_AUTHORIZATION=header)
    return ApiTokenAuthentication().authenticate(request)


def test_an_issued_token_stores_only_the_hash_of_its_secret(tenant):
    token, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    key_id, secret = tokens.split(plaintext)
    assert plaintext.startswith(f"ank_{token.key_id}_")
    assert secret not in token.key_hash
    assert token.key_hash == tokens.hash_secret(secret)
    assert str(token) == f"billing (ank_{token.key_id}_…)"


def test_a_tenant_token_authenticates_as_that_tenant_and_holds_no_staff_power(tenant):
    _, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    user, _ = authenticate(f"Bearer {plaintext}")
    assert isinstance(user, TenantClient)
    assert tenant_of(user) == tenant
    assert (user.is_authenticated, user.is_staff, user.has_perm("commands.change_command")) == (
        True,
        False,
        False,
    )


def test_a_staff_token_authenticates_as_the_user(staff):
    _, plaintext = ApiToken.issue(name="ops laptop", user=staff)
    user, _ = authenticate(f"Bearer {plaintext}")
    assert user == staff
    assert tenant_of(user) is None


def test_a_wrong_secret_is_refused(tenant):
    _, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    with pytest.raises(AuthenticationFailed, match="Invalid, revoked or inactive token"):
        authenticate(f"Bearer {plaintext[:-2]}xx")


def test_a_revoked_token_is_refused(tenant):
    token, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    with pytest.raises(AuthenticationFailed):
        authenticate(f"Bearer {plaintext}")


def test_an_inactive_tenants_token_is_refused(tenant):
    _, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    Tenant.objects.filter(pk=tenant.pk).update(active=False)
    with pytest.raises(AuthenticationFailed):
        authenticate(f"Bearer {plaintext}")


@pytest.mark.parametrize(
    "header", ["Bearer", "Bearer a b", "Bearer nonsense", "Bearer ank_short_x", b"Bearer \xff\xfe"]
)
def test_a_malformed_bearer_header_is_refused_with_a_reason(header):
    with pytest.raises(AuthenticationFailed):
        authenticate(header)


def test_other_schemes_are_left_to_other_authenticators():
    assert authenticate("Token abc") is None
    assert authenticate("") is None


def test_use_is_recorded_at_most_once_a_minute(tenant):
    token, plaintext = ApiToken.issue(name="billing", tenant=tenant)
    authenticate(f"Bearer {plaintext}")
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    authenticate(f"Bearer {plaintext}")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    tokens.touch(token, now=first + tokens.LAST_USED_RESOLUTION + timezone.timedelta(seconds=1))
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


def test_a_token_needs_exactly_one_owner(tenant, staff):
    with pytest.raises(ValidationError, match="exactly one"):
        ApiToken.issue(name="both", tenant=tenant, user=staff)
    with pytest.raises(ValidationError, match="exactly one"):
        ApiToken.issue(name="neither")


def test_the_admin_shows_the_token_once_and_then_only_its_id(admin_client, tenant):
    response = admin_client.post(
        "/admin/limits/apitoken/add/", {"name": "billing", "tenant": tenant.pk, "user": ""}
    )
    assert response.status_code == 200
    plaintext = response.context["plaintext"]
    assert plaintext in response.content.decode()
    token = ApiToken.objects.get()
    assert tokens.secret_matches(tokens.split(plaintext)[1], token.key_hash)
    for page in ("/admin/limits/apitoken/", f"/admin/limits/apitoken/{token.pk}/change/"):
        body = admin_client.get(page).content.decode()
        assert f"ank_{token.key_id}_…" in body
        assert plaintext not in body
        assert token.key_hash not in body


def test_the_admin_revokes_tokens(admin_client, tenant):
    token, _ = ApiToken.issue(name="billing", tenant=tenant)
    admin_client.post("/admin/limits/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_the_token_command_issues_and_revokes(tenant, capsys):
    call_command("token", "issue", "--tenant", "acme", "--name", "ci")
    plaintext = capsys.readouterr().out.strip()
    key_id, _ = tokens.split(plaintext)
    call_command("token", "revoke", key_id)
    assert ApiToken.objects.get(key_id=key_id).revoked_at is not None
    with pytest.raises(CommandError, match="No active token"):
        call_command("token", "revoke", key_id)


def test_the_token_command_refuses_an_unknown_tenant():
    with pytest.raises(CommandError, match="No tenant 'nope'"):
        call_command("token", "issue", "--tenant", "nope", "--name", "ci")


NAME_RULE = "A token's name is one line of printable text: no control characters."


@pytest.mark.parametrize("name", ["ci\x01", "line\nbreak", "tab\there", "del\x7f", "sep\u2028", "bad\udcff"])
def test_a_tokens_name_refuses_control_characters(tenant, name):
    with pytest.raises(ValidationError) as refused:
        ApiToken.issue(name=name, tenant=tenant)
    assert refused.value.message_dict == {"name": [NAME_RULE]}
    assert not ApiToken.objects.exists()


def test_a_tokens_name_may_hold_any_printable_text(tenant):
    token, _ = ApiToken.issue(name="Billing – Zürich 請求 ✓", tenant=tenant)
    assert token.name == "Billing – Zürich 請求 ✓"


def test_the_admin_refuses_a_token_name_with_control_characters(admin_client, tenant):
    response = admin_client.post(
        "/admin/limits/apitoken/add/", {"name": "bill\x01ing", "tenant": tenant.pk, "user": ""}
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"name": [NAME_RULE]}
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", "--name: This field cannot be blank."),
        ("   ", "--name: This field cannot be blank."),
        ("x" * 300, "--name: Ensure this value has at most 100 characters (it has 300)."),
        ("ci\x01", f"--name: {NAME_RULE}"),
    ],
)
def test_the_token_command_refuses_a_bad_name_naming_the_rule(tenant, capsys, name, error):
    with pytest.raises(CommandError) as refused:
        call_command("token", "issue", "--tenant", "acme", "--name", name)
    assert str(refused.value) == error
    assert capsys.readouterr().out == ""
    assert not ApiToken.objects.exists()
