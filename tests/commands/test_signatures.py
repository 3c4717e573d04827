import base64
import hashlib
import hmac

import pytest

from commands.intake.headers import Headers
from commands.intake.signatures import VERIFIERS, VerifierConfigError, build_verifier

NOW = 1_790_000_000.0
BODY = b'{"id":"evt_1","type":"ping"}'
STANDARD_SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def secret_for(kind):
    return STANDARD_SECRET if kind in ("standard", "svix") else "s3cret"


SIGNED_KINDS = [kind for kind in VERIFIERS if kind != "none"]


@pytest.mark.parametrize("kind", SIGNED_KINDS)
def test_a_body_signed_with_the_secret_is_accepted(kind):
    verifier = build_verifier(kind, [secret_for(kind)])
    assert verifier.verify(verifier.sign(BODY, NOW), BODY, NOW) is None


@pytest.mark.parametrize("kind", SIGNED_KINDS)
def test_a_changed_body_is_refused(kind):
    verifier = build_verifier(kind, [secret_for(kind)])
    headers = verifier.sign(BODY, NOW)
    assert verifier.verify(headers, BODY + b" ", NOW) == "signature does not match"


@pytest.mark.parametrize("kind", SIGNED_KINDS)
def test_a_signature_made_with_another_secret_is_refused(kind):
    other = (
        "whsec_" + base64.b64encode(b"another-secret-another-secret!!").decode()
        if kind in ("standard", "svix")
        else "other"
    )
    verifier = build_verifier(kind, [secret_for(kind)])
    headers = build_verifier(kind, [other]).sign(BODY, NOW)
    assert verifier.verify(headers, BODY, NOW) == "signature does not match"


@pytest.mark.parametrize("kind", SIGNED_KINDS)
def test_rotation_accepts_either_secret_of_the_list(kind):
    old, new = secret_for(kind), (STANDARD_SECRET[:-4] + "AAA=" if kind in ("standard", "svix") else "new")
    verifier = build_verifier(kind, [new, old])
    assert verifier.verify(build_verifier(kind, [old]).sign(BODY, NOW), BODY, NOW) is None
    assert verifier.verify(build_verifier(kind, [new]).sign(BODY, NOW), BODY, NOW) is None


@pytest.mark.parametrize("kind", SIGNED_KINDS)
def test_a_request_without_the_signature_headers_is_refused_naming_what_is_missing(kind):
    assert build_verifier(kind, [secret_for(kind)]).verify({}, BODY, NOW).startswith("missing ")


def test_header_names_are_case_insensitive():
    verifier = build_verifier("github", ["s3cret"])
    headers = {k.lower(): v for k, v in verifier.sign(BODY, NOW).items()}
    assert verifier.verify(headers, BODY, NOW) is None


def test_headers_read_from_a_wsgi_environ_are_found_by_any_case_and_verified_as_sent():
    body = b'{"a": 1}'
    signature = build_verifier("github", ["s3cret"]).sign(body, 0)["X-Hub-Signature-256"]
    environ = {
        "HTTP_X_HUB_SIGNATURE_256": f" {signature} ",
        "HTTP_X_GITHUB_DELIVERY": "evt-1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "8",
        "PATH_INFO": "/hooks/acme/orders/",
        "wsgi.input": object(),
    }
    headers = Headers.from_environ(environ)
    assert headers.get("X-GitHub-Delivery") == headers.get("x-github-delivery") == "evt-1"
    assert headers.stripped("X-HUB-SIGNATURE-256") == signature
    assert (headers.get("Content-Type"), headers.get("content-length")) == ("application/json", "8")
    assert headers.get("Path-Info") is None and headers.stripped("X-Missing") is None
    assert build_verifier("github", ["s3cret"]).verify(headers, body, 0) is None


def test_github_signature_is_the_documented_hmac_sha256_hex():
    expected = "sha256=" + hmac.new(b"s3cret", BODY, hashlib.sha256).hexdigest()
    assert build_verifier("github", ["s3cret"]).sign(BODY, NOW) == {"X-Hub-Signature-256": expected}


def test_shopify_signature_is_base64():
    expected = base64.b64encode(hmac.new(b"s3cret", BODY, hashlib.sha256).digest()).decode()
    assert build_verifier("shopify", ["s3cret"]).sign(BODY, NOW) == {"X-Shopify-Hmac-Sha256": expected}


def test_stripe_signature_covers_timestamp_and_body():
    stamp = int(NOW)
    v1 = hmac.new(b"s3cret", f"{stamp}.".encode() + BODY, hashlib.sha256).hexdigest()
    verifier = build_verifier("stripe", ["s3cret"])
    assert verifier.verify({"Stripe-Signature": f"t={stamp},v1=deadbeef,v1={v1},v0=zz"}, BODY, NOW) is None


def test_stripe_refuses_a_replayed_timestamp_older_than_five_minutes():
    verifier = build_verifier("stripe", ["s3cret"])
    headers = verifier.sign(BODY, NOW - 301)
    assert "tolerance" in verifier.verify(headers, BODY, NOW)


def test_stripe_accepts_a_timestamp_exactly_at_the_tolerance():
    verifier = build_verifier("stripe", ["s3cret"])
    assert verifier.verify(verifier.sign(BODY, NOW - 300), BODY, NOW) is None


def test_stripe_refuses_a_timestamp_from_the_future_beyond_the_tolerance():
    verifier = build_verifier("stripe", ["s3cret"])
    assert "tolerance" in verifier.verify(verifier.sign(BODY, NOW + 301), BODY, NOW)


def test_stripe_tolerance_is_configurable():
    verifier = build_verifier("stripe", ["s3cret"], {"tolerance_s": 600})
    assert verifier.verify(verifier.sign(BODY, NOW - 500), BODY, NOW) is None


def test_stripe_with_a_malformed_timestamp_is_refused():
    assert build_verifier("stripe", ["s3cret"]).verify({"Stripe-Signature": "t=abc,v1=00"}, BODY, NOW) == (
        "missing or malformed timestamp"
    )


@pytest.mark.parametrize(
    "stamp", ["\u00b2", "\u0661\u0662", "9" * 13, "9" * 309, "9" * 4301, "-1", "1.5", ""]
)
@pytest.mark.parametrize("kind", ["stripe", "standard", "svix"])
def test_a_timestamp_that_is_not_a_few_ascii_digits_is_refused_as_malformed(kind, stamp):
    secret = STANDARD_SECRET if kind != "stripe" else "s3cret"
    verifier = build_verifier(kind, [secret])
    headers = verifier.sign(BODY, NOW)
    if kind == "stripe":
        headers["Stripe-Signature"] = headers["Stripe-Signature"].replace(f"t={int(NOW)}", f"t={stamp}")
    else:
        headers[f"{verifier.prefix}-timestamp"] = stamp
    assert verifier.verify(headers, BODY, NOW) == "missing or malformed timestamp"


def test_standard_webhooks_signature_matches_the_specification_example():
    # The example from the Standard Webhooks specification.
    verifier = build_verifier("standard", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], {"tolerance_s": 86_400})
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    assert verifier.verify(headers, body, 1614265330) is None


def test_svix_uses_svix_header_names():
    headers = build_verifier("svix", [STANDARD_SECRET]).sign(BODY, NOW, message_id="msg_9")
    assert sorted(headers) == ["svix-id", "svix-signature", "svix-timestamp"]
    assert (
        build_verifier("standard", [STANDARD_SECRET]).verify(headers, BODY, NOW)
        == "missing webhook-id header"
    )


def test_standard_webhooks_refuses_a_replayed_timestamp():
    verifier = build_verifier("standard", [STANDARD_SECRET])
    assert "tolerance" in verifier.verify(verifier.sign(BODY, NOW - 3600), BODY, NOW)


def test_generic_hmac_uses_the_configured_header_algorithm_encoding_and_prefix():
    options = {"header": "X-Sig", "algorithm": "sha512", "encoding": "base64", "prefix": "v1="}
    verifier = build_verifier("hmac", ["s3cret"], options)
    expected = "v1=" + base64.b64encode(hmac.new(b"s3cret", BODY, hashlib.sha512).digest()).decode()
    assert verifier.sign(BODY, NOW) == {"X-Sig": expected}
    assert verifier.verify({"X-Sig": expected}, BODY, NOW) is None
    assert verifier.verify({"X-Sig": expected[3:]}, BODY, NOW) == "X-Sig does not start with 'v1='"


def test_a_signature_that_is_not_valid_hex_is_refused_not_an_error():
    verifier = build_verifier("github", ["s3cret"])
    assert verifier.verify({"X-Hub-Signature-256": "sha256=not-hex\u00e9"}, BODY, NOW) == (
        "X-Hub-Signature-256 is not valid hex"
    )


def test_none_accepts_everything():
    assert build_verifier("none").verify({}, b"anything", NOW) is None


@pytest.mark.parametrize(
    ("kind", "secrets", "options", "field"),
    [
        ("pgp", ["x"], {}, "kind"),
        ("github", [], {}, "secrets"),
        ("github", [""], {}, "secrets"),
        ("github", "s3cret", {}, "secrets"),
        ("github", ["x"], {"header": "X"}, "options"),
        ("hmac", ["x"], {"algorithm": "md5"}, "options.algorithm"),
        ("hmac", ["x"], {"encoding": "base32"}, "options.encoding"),
        ("hmac", ["x"], {"header": "Bad Header"}, "options.header"),
        ("stripe", ["x"], {"tolerance_s": 0}, "options.tolerance_s"),
        ("stripe", ["x"], {"tolerance_s": "300"}, "options.tolerance_s"),
        ("standard", ["whsec_not base64!"], {}, "secrets[0]"),
        ("none", [], {"header": "X"}, "options"),
    ],
)
def test_a_bad_configuration_fails_at_build_time_naming_the_field(kind, secrets, options, field):
    with pytest.raises(VerifierConfigError) as excinfo:
        build_verifier(kind, secrets, options)
    assert excinfo.value.field == field


def test_a_refusal_never_contains_the_secret_or_the_expected_signature():
    verifier = build_verifier("github", ["very-secret-value"])
    good = verifier.sign(BODY, NOW)["X-Hub-Signature-256"]
    reason = verifier.verify({"X-Hub-Signature-256": "sha256=" + "0" * 64}, BODY, NOW)
    assert "very-secret-value" not in reason
    assert good[7:] not in reason
