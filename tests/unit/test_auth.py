"""Authorizer: bearer parsing, roles, verified-credential caching (control plane faked)."""
import pytest

from chalicelib.auth import Authorizer, allowed, parse_bearer
from chalicelib.clock import ManualClock
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import ForbiddenError, UnauthorizedError, http_status_of


class FakeAccounts:
    """Stands in for ControlPlane.verify_account; counts the (slow) verifications."""

    def __init__(self, clock):
        self.clock = clock
        self.accounts = {"admin": ("pw-admin", Role.ROLE_ADMIN), "user": ("pw:with:colons", Role.ROLE_USER)}
        self.verifications = 0

    def verify_account(self, user_name, password):
        self.verifications += 1
        stored = self.accounts.get(user_name)
        return stored[1] if stored and stored[0] == password else None


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def accounts(clock):
    return FakeAccounts(clock)


@pytest.fixture
def authorizer(accounts):
    return Authorizer(accounts, ttl_s=10.0)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": ""}, {"Authorization": "Basic YWRtaW46cHc="}, bearer(""), bearer("nocolon"),
    bearer(":pw"), bearer("admin:"),
])
def test_missing_or_malformed_credentials_are_401(headers):
    with pytest.raises(UnauthorizedError) as err:
        parse_bearer(headers)
    assert http_status_of(err.value) == 401


def test_header_name_is_case_insensitive_and_password_may_contain_colons():
    assert parse_bearer({"authorization": "bearer user:pw:with:colons"}) == ("user", "pw:with:colons")


def test_roles():
    assert allowed(Role.ROLE_ADMIN, "admin") and allowed(Role.ROLE_ADMIN, "meta") and allowed(Role.ROLE_ADMIN, "debug")
    assert allowed(Role.ROLE_USER, "meta")
    assert not allowed(Role.ROLE_USER, "admin") and not allowed(Role.ROLE_USER, "debug")


def test_wrong_password_is_401_and_names_no_secret(authorizer):
    with pytest.raises(UnauthorizedError) as err:
        authorizer.authorize(bearer("admin:wrong"), "admin")
    assert "wrong" not in str(err.value) and "pw-admin" not in str(err.value)
    with pytest.raises(UnauthorizedError):
        authorizer.authorize(bearer("ghost:pw"), "meta")


def test_user_role_is_forbidden_outside_meta(authorizer):
    assert authorizer.authorize(bearer("user:pw:with:colons"), "meta").role == Role.ROLE_USER
    with pytest.raises(ForbiddenError) as err:
        authorizer.authorize(bearer("user:pw:with:colons"), "admin")
    assert http_status_of(err.value) == 403
    assert "pw:with:colons" not in str(err.value)


def test_verified_credentials_are_cached_for_ttl(authorizer, accounts, clock):
    for _ in range(5):
        assert authorizer.authorize(bearer("admin:pw-admin"), "admin").user_name == "admin"
    assert accounts.verifications == 1
    del accounts.accounts["admin"]
    clock.advance(9.9)
    authorizer.authorize(bearer("admin:pw-admin"), "admin")
    clock.advance(0.2)
    with pytest.raises(UnauthorizedError):
        authorizer.authorize(bearer("admin:pw-admin"), "admin")


def test_failures_are_not_cached_as_successes(authorizer, accounts):
    with pytest.raises(UnauthorizedError):
        authorizer.authorize(bearer("admin:guess"), "admin")
    authorizer.authorize(bearer("admin:pw-admin"), "admin")
    with pytest.raises(UnauthorizedError):
        authorizer.authorize(bearer("admin:guess"), "admin")
    assert accounts.verifications == 3


def test_cache_is_bounded(accounts):
    authorizer = Authorizer(accounts, ttl_s=10.0, max_entries=2)
    accounts.accounts.update({f"u{i}": ("pw", Role.ROLE_USER) for i in range(5)})
    for i in range(5):
        authorizer.authorize(bearer(f"u{i}:pw"), "meta")
    assert len(authorizer._verified) <= 2
