"""Validation of what the control plane stores: registrations and accounts (the generic
field checks are ``protocol.validation``'s)."""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol.block_keys import scheme_from_config
from ..protocol.codes import Role
from ..protocol.models import RegisterInstanceRequest
from ..protocol.validation import (
    invalid,
    require,
    require_key_name,
    require_name,
    require_non_negative,
    require_positive,
    require_unique,
)

MAX_PASSWORD_LENGTH = 1024
MIN_PASSWORD_LENGTH = 12

#: Registration limits. Every call renders the instance's specs (a location's spec group
#: is one byte in the index), and its record is one DynamoDB item (at most 400 KB): a
#: config past these is refused at registration rather than failing every later call.
MAX_LOCATION_SPECS = 64
MAX_LOCATION_SPEC_GROUPS = 64
MAX_USER_DATA_BYTES = 64 * 1024
MAX_EXTRA_BYTES = 16 * 1024
#: model_name, dtype, lora_name: names, not documents.
MAX_DEPLOYMENT_NAME_BYTES = 1024
#: A block's bytes over all its specs: far above any KV block, far below int64 once
#: multiplied by the key counts of a call (a size of 2^62 overflowed every start).
MAX_BLOCK_BYTES = 1 << 40


def require_bytes_at_most(value: str, limit: int, path: str) -> None:
    """Fail when ``value`` is longer than ``limit`` bytes of UTF-8."""
    _require_at_most(len(value.encode("utf-8", "surrogatepass")), limit, path, "bytes")


def _require_at_most(count: int, limit: int, path: str, what: str) -> None:
    if count > limit:
        raise invalid(path, f"has {count} {what}, more than the limit of {limit}")


def validate_register_request(request: RegisterInstanceRequest) -> None:
    """The rules of MetaService.registerInstance (API.md): raises InvalidArgumentError."""
    require_key_name(request.instance_group, "instance_group")
    require_key_name(request.instance_id, "instance_id")
    require_positive(request.block_size, "block_size")
    if not request.location_spec_infos:
        raise invalid("location_spec_infos", "needs at least one entry")
    _require_at_most(len(request.location_spec_infos), MAX_LOCATION_SPECS, "location_spec_infos", "entries")
    _require_at_most(len(request.location_spec_groups), MAX_LOCATION_SPEC_GROUPS, "location_spec_groups", "entries")
    for i, spec in enumerate(request.location_spec_infos):
        require_name(spec.name, f"location_spec_infos[{i}].name")
        require_positive(spec.size, f"location_spec_infos[{i}].size")
        _require_at_most(spec.size, MAX_BLOCK_BYTES, f"location_spec_infos[{i}].size", "bytes")
    _require_at_most(
        sum(spec.size for spec in request.location_spec_infos), MAX_BLOCK_BYTES, "location_spec_infos", "bytes in all"
    )
    require_unique((s.name for s in request.location_spec_infos), "location_spec_infos")
    deployment = request.model_deployment
    if deployment is None:
        raise invalid("model_deployment", "is required")
    require(deployment.model_name, "model_deployment.model_name")
    require(deployment.dtype, "model_deployment.dtype")
    for name in ("model_name", "dtype", "lora_name"):
        require_bytes_at_most(getattr(deployment, name), MAX_DEPLOYMENT_NAME_BYTES, f"model_deployment.{name}")
    require_bytes_at_most(deployment.user_data, MAX_USER_DATA_BYTES, "model_deployment.user_data")
    require_bytes_at_most(deployment.extra, MAX_EXTRA_BYTES, "model_deployment.extra")
    for name in ("tp_size", "dp_size", "pp_size"):
        require_non_negative(getattr(deployment, name), f"model_deployment.{name}")
    spec_names = {s.name for s in request.location_spec_infos}
    for i, group in enumerate(request.location_spec_groups):
        require_name(group.name, f"location_spec_groups[{i}].name")
        if not group.spec_names:
            raise invalid(f"location_spec_groups[{i}].spec_names", "needs at least one spec name")
        for j, spec_name in enumerate(group.spec_names):
            if spec_name not in spec_names:
                raise invalid(
                    f"location_spec_groups[{i}].spec_names[{j}]",
                    f"names unknown spec {spec_name!r} (not in location_spec_infos)",
                )
        require_unique(group.spec_names, f"location_spec_groups[{i}].spec_names")
    require_unique((g.name for g in request.location_spec_groups), "location_spec_groups")
    scheme_from_config(request.key_scheme, "key_scheme")
    if request.query_type and request.default_query_type and request.query_type != request.default_query_type:
        raise invalid(
            "query_type",
            f"is {request.query_type.name}, which disagrees with default_query_type "
            f"{request.default_query_type.name} (the same setting under its earlier name)",
        )


def validate_account(
    user_name: str, password: str, role: Role, groups: Sequence[str], instance_prefixes: Sequence[str]
) -> None:
    """An account as addAccount accepts it: a name, a password meeting the policy for
    admin accounts (the others' is ignored: they authenticate with API keys), a scope of
    instance group names (``*`` = every group) and instance-id prefixes."""
    require_name(user_name, "user_name")
    # The password bearer token is "<user_name>:<password>", split at the first colon.
    if ":" in user_name:
        raise invalid("user_name", "must not contain ':'")
    if role == Role.ROLE_ADMIN:
        validate_password(user_name, password)
    for i, group in enumerate(groups):
        if group != "*":
            require_key_name(group, f"instance_groups[{i}]")
    require_unique(groups, "instance_groups")
    for i, prefix in enumerate(instance_prefixes):
        require_key_name(prefix, f"instance_id_prefixes[{i}]")


#: Parts of passwords guessers try first; removed (with the user name, runs like "1234",
#: "cba" or "aaa") before counting what is left.
COMMON_PASSWORD_PARTS = (
    "password",
    "passw0rd",
    "qwerty",
    "azerty",
    "asdf",
    "zxcv",
    "letmein",
    "welcome",
    "admin",
    "administrator",
    "changeme",
    "default",
    "iloveyou",
    "monkey",
    "dragon",
    "master",
    "login",
    "kvcm",
)
#: Characters a password must keep once its guessable parts are removed.
MIN_UNGUESSABLE_CHARACTERS = 6


def _unguessable(user_name: str, password: str) -> str:
    """``password`` (case-folded) without the user name, common parts and runs of three or
    more consecutive or repeated characters."""
    text = password.casefold()
    for part in sorted({*COMMON_PASSWORD_PARTS, *([user_name.casefold()] if len(user_name) >= 3 else [])}, key=len)[
        ::-1
    ]:
        text = text.replace(part, "")
    kept: list[str] = []
    i = 0
    while i < len(text):
        j = i + 1
        step = ord(text[j]) - ord(text[i]) if j < len(text) else None
        while step in (-1, 0, 1) and j < len(text) and ord(text[j]) - ord(text[j - 1]) == step:
            j += 1
        kept.extend(text[i:j] if j - i < 3 else ())
        i = j
    return "".join(kept)


def validate_password(user_name: str, password: str) -> None:
    """The password policy of admin accounts: 12 to 1024 characters, 4 distinct, and 6 left
    once the user name, common parts (``COMMON_PASSWORD_PARTS``) and runs of three or more
    consecutive or repeated characters are removed (``Password1234``, ``qwerty123456``,
    ``abcdefghijkl`` are refused; a passphrase passes)."""
    require(password, "password")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise invalid("password", f"is longer than {MAX_PASSWORD_LENGTH} characters")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise invalid("password", f"must have at least {MIN_PASSWORD_LENGTH} characters")
    if len(set(password)) < 4 or len(_unguessable(user_name, password)) < MIN_UNGUESSABLE_CHARACTERS:
        raise invalid(
            "password",
            f"is too easy to guess: fewer than 4 distinct characters, or fewer than {MIN_UNGUESSABLE_CHARACTERS} "
            "left without the user name, common words and runs like '1234' or 'aaa'",
        )
