"""Authorizer: bearer parsing, API keys, admin passwords, the failure limiter, roles and
scopes (config cache and control plane faked: pure logic)."""

import pytest

from chalicelib.auth import (
    ALL_GROUPS,
    Action,
    Authorizer,
    FailureLimiter,
    Principal,
    Scope,
    Target,
    check_action,
    check_target,
    parse_bearer,
)
from chalicelib.clock import ManualClock
from chalicelib.control.api_keys import ApiKeyRecord, digest, key_id_of, new_api_key
from chalicelib.control.records import AccountRecord
from chalicelib.protocol.codes import ErrorCode, Role
from chalicelib.protocol.errors import (
    ForbiddenError,
    TooManyAttemptsError,
    UnauthorizedError,
    http_status_of,
    status_of,
)


class FakeDirectory:
    """Stands in for ConfigCache (accounts, keys) and ControlPlane.verify_account."""

    def __init__(self, clock):
        self.clock = clock
        self.accounts = {
            "admin": AccountRecord("admin", Role.ROLE_ADMIN, (ALL_GROUPS,), (), "pw-admin"),
            "eng": AccountRecord("eng", Role.ROLE_USER, ("g1",), ("eng-",)),
        }
        self.keys = {}
        self.looked_up = set()
        self.verifications = 0

    def add_key(self, user_name, expires_us=0):
        key_id, api_key = new_api_key()
        self.keys[key_id] = ApiKeyRecord(key_id, user_name, digest(api_key), 0, expires_us)
        return api_key

    def account(self, user_name):
        return self.accounts.get(user_name)

    def api_key(self, key_id, before_load=lambda: None):
        if key_id not in self.looked_up:  # as ConfigCache: a table read the first time only
            before_load()
            self.looked_up.add(key_id)
        return self.keys.get(key_id)

    def verify_account(self, user_name, password):
        self.verifications += 1
        account = self.accounts.get(user_name)
        return account if account and account.password_hash and account.password_hash == password else None


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def directory(clock):
    return FakeDirectory(clock)


@pytest.fixture
def authorizer(directory, clock):
    return Authorizer(directory, directory, clock, password_ttl_s=10.0)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": ""}, {"Authorization": "Basic YWRtaW46cHc="}, bearer("")])
def test_missing_or_malformed_headers_are_401_with_an_auth_code(headers):
    with pytest.raises(UnauthorizedError) as err:
        parse_bearer(headers)
    assert http_status_of(err.value) == 401 and status_of(err.value)[0] == ErrorCode.UNAUTHENTICATED


@pytest.mark.parametrize("token", ["nocolon", ":pw", "admin:", "kvcm_0123.short", "kvcm_" + "g" * 16 + "." + "a" * 43])
def test_malformed_tokens_are_401(authorizer, token):
    with pytest.raises(UnauthorizedError):
        authorizer.authenticate(bearer(token))


def test_header_name_is_case_insensitive_and_password_may_contain_colons(authorizer, directory):
    directory.accounts["admin"] = AccountRecord("admin", Role.ROLE_ADMIN, (ALL_GROUPS,), (), "pw:with:colons")
    assert authorizer.authenticate({"authorization": "bearer admin:pw:with:colons"}).user_name == "admin"


def test_an_api_key_names_its_account_role_scope_and_key(authorizer, directory):
    api_key = directory.add_key("eng")
    principal = authorizer.authenticate(bearer(api_key))
    assert principal == Principal("eng", Role.ROLE_USER, Scope(frozenset({"g1"}), ("eng-",)), key_id_of(api_key))
    assert principal.label == f"eng/{key_id_of(api_key)}"


def test_a_wrong_secret_an_expired_or_revoked_key_or_a_deleted_account_is_401(authorizer, directory, clock):
    api_key = directory.add_key("eng")
    key_id = key_id_of(api_key)
    forged = api_key[:-1] + ("A" if api_key[-1] != "A" else "B")
    with pytest.raises(UnauthorizedError, match=f"invalid API key '{key_id}'") as err:
        authorizer.authenticate(bearer(forged))
    assert api_key.split(".")[1] not in str(err.value)
    expiring = directory.add_key("eng", expires_us=int((clock.now() + 5) * 1e6))
    authorizer.authenticate(bearer(expiring))
    clock.advance(5)
    with pytest.raises(UnauthorizedError, match="has expired"):
        authorizer.authenticate(bearer(expiring))
    del directory.accounts["eng"]
    with pytest.raises(UnauthorizedError, match="belongs to no account"):
        authorizer.authenticate(bearer(api_key))
    directory.keys.clear()
    with pytest.raises(UnauthorizedError):
        authorizer.authenticate(bearer(api_key))


def test_passwords_are_for_admin_accounts_only_and_cached_for_their_ttl(authorizer, directory, clock):
    for _ in range(5):
        assert authorizer.authenticate(bearer("admin:pw-admin")).role == Role.ROLE_ADMIN
    assert directory.verifications == 1
    with pytest.raises(UnauthorizedError, match="admin accounts only"):
        authorizer.authenticate(bearer("eng:anything"))
    del directory.accounts["admin"]
    clock.advance(9.9)
    authorizer.authenticate(bearer("admin:pw-admin"))
    clock.advance(0.2)
    with pytest.raises(UnauthorizedError):
        authorizer.authenticate(bearer("admin:pw-admin"))


def test_failed_passwords_lock_the_pair_then_the_node_without_checking(directory, clock):
    limiter = FailureLimiter(clock, per_name=3, per_window=5, window_s=60, trust_s=3600)
    authorizer = Authorizer(directory, directory, clock, limiter=limiter)
    authorizer.authenticate(bearer("admin:pw-admin"), source="10.0.0.1")  # the admin's pair: trusted
    clock.advance(11)  # past the verified-credentials cache
    for _ in range(3):
        with pytest.raises(UnauthorizedError):
            authorizer.authenticate(bearer("admin:guess"), source="10.6.6.6")
    checked = directory.verifications
    with pytest.raises(TooManyAttemptsError, match="password attempts for 'admin'") as err:
        authorizer.authenticate(bearer("admin:pw-admin"), source="10.6.6.6")
    assert http_status_of(err.value) == 429 and directory.verifications == checked  # no scrypt spent
    assert authorizer.authenticate(bearer("admin:pw-admin"), source="10.0.0.2").user_name == "admin"  # other pair
    for user in ("u1", "u2"):
        with pytest.raises(UnauthorizedError):
            authorizer.authenticate(bearer(f"{user}:guess"), source="10.6.6.7")
    with pytest.raises(TooManyAttemptsError, match="on this node"):
        authorizer.authenticate(bearer("u3:guess"), source="10.6.6.8")
    clock.advance(11)
    # The node-wide bound holds for pairs not verified recently, never for the trusted one.
    with pytest.raises(TooManyAttemptsError, match="on this node"):
        authorizer.authenticate(bearer("admin:pw-admin"), source="10.0.0.3")
    assert authorizer.authenticate(bearer("admin:pw-admin"), source="10.0.0.1").user_name == "admin"
    clock.advance(60)
    assert authorizer.authenticate(bearer("admin:pw-admin"), source="10.6.6.6").user_name == "admin"


def test_unknown_key_ids_are_limited_per_source_and_known_ones_still_pass(directory, clock):
    known = directory.add_key("eng")
    fresh = directory.add_key("eng")
    authorizer = Authorizer(
        directory,
        directory,
        clock,
        key_limiter=FailureLimiter(clock, per_name=2, per_window=3, spare_clean=True, what="API key lookups"),
    )
    authorizer.authenticate(bearer(known), source="a")  # seen: cached from now on
    for _ in range(2):
        with pytest.raises(UnauthorizedError, match="invalid API key"):
            authorizer.authenticate(bearer(new_api_key()[1]), source="a")
    looked_up = len(directory.looked_up)
    with pytest.raises(TooManyAttemptsError, match="API key lookups"):
        authorizer.authenticate(bearer(new_api_key()[1]), source="a")
    assert len(directory.looked_up) == looked_up  # refused before the table read
    assert authorizer.authenticate(bearer(known), source="a").user_name == "eng"
    with pytest.raises(UnauthorizedError, match="invalid API key"):
        authorizer.authenticate(bearer(new_api_key()[1]), source="b")  # the node's 3rd miss
    with pytest.raises(TooManyAttemptsError, match="on this node"):
        authorizer.authenticate(bearer(new_api_key()[1]), source="b")  # b has missed: node-wide bound
    assert authorizer.authenticate(bearer(fresh), source="c").user_name == "eng"  # a clean source is spared
    clock.advance(60)
    with pytest.raises(UnauthorizedError, match="invalid API key"):
        authorizer.authenticate(bearer(new_api_key()[1]), source="a")


def test_the_verified_cache_is_bounded(directory, clock):
    authorizer = Authorizer(directory, directory, clock, max_entries=2)
    directory.accounts.update({f"u{i}": AccountRecord(f"u{i}", Role.ROLE_ADMIN, ("*",), (), "pw") for i in range(5)})
    for i in range(5):
        authorizer.authenticate(bearer(f"u{i}:pw"))
    assert len(authorizer._verified) <= 2


@pytest.mark.parametrize(
    "role, allowed",
    [
        (Role.ROLE_ADMIN, set(Action)),
        (
            Role.ROLE_OPERATOR,
            {
                Action.META_READ,
                Action.META_WRITE,
                Action.GROUP_READ,
                Action.GROUP_WRITE,
                Action.SERVICE_READ,
                Action.SERVICE_WRITE,
            },
        ),
        (Role.ROLE_ENGINE, {Action.META_READ, Action.META_WRITE}),
        (Role.ROLE_READ_ONLY, {Action.META_READ, Action.GROUP_READ, Action.SERVICE_READ}),
    ],
)
def test_roles(role, allowed):
    principal = Principal("p", role)
    for action in Action:
        if action in allowed:
            check_action(principal, action, "m")
        else:
            with pytest.raises(ForbiddenError) as err:
                check_action(principal, action, "m")
            assert status_of(err.value)[0] == ErrorCode.PERMISSION_DENIED and http_status_of(err.value) == 403


def test_scopes():
    scoped = Principal("eng", Role.ROLE_USER, Scope(frozenset({"g1"}), ("eng-",)))
    check_target(scoped, Target(group="g1", instance_id="eng-1"), "m")
    check_target(scoped, Target(group=None, instance_id="eng-2"), "m")  # not registered: the call says so
    for target in (Target(service=True), Target(group="g2", instance_id="eng-1"), Target(group="g1", instance_id="x")):
        with pytest.raises(ForbiddenError):
            check_target(scoped, target, "m")
    everywhere = Principal("ops", Role.ROLE_OPERATOR)
    check_target(everywhere, Target(service=True), "m")
    check_target(everywhere, Target(group="any"), "m")
