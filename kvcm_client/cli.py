"""``kvcm``: the operator's command line over the KVCM API (through ``KvcmClient``).

Tables for people, ``--json`` for scripts; errors in one line on stderr. Exit codes:
0 done, 1 the service answered an error code, 2 bad usage or input, 3 the service could
not be reached (or did not answer the protocol), 4 refused (HTTP 401/403/429), 5 unhealthy
(``kvcm health``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ValidationError

from chalicelib.protocol import models as m
from chalicelib.protocol.codes import Role
from chalicelib.protocol.wire import render

from .client import DEFAULT_URL, KvcmClient
from .errors import AuthError, KvcmError, ProtocolError, TransportError

EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_UNHEALTHY = 1, 2, 3, 4, 5
SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class Failure(click.ClickException):
    """An error reported in one line with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        # click declares exit_code a class variable; each Failure carries its own.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"kvcm: error: {self.message}", err=True)


# ---------------------------------------------------------------- formatting


def parse_size(text: str) -> int:
    """``"100GiB"``, ``"1.5TB"``, ``"4096"`` → bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in SIZE_UNITS:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 4096, 512MiB, 100GiB, 1TB)")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def parse_watermark(text: str) -> float:
    """``"0.8"`` or ``"80%"`` → 0.8: where reclaim starts, as a fraction of the quota."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(%?)\s*", text)
    value = float(match.group(1)) / (100 if match.group(2) else 1) if match else 0.0
    if not value > 0:
        raise click.BadParameter(f"watermark {text!r} is not a positive fraction or percentage (e.g. 0.8 or 80%)")
    return value


def human_size(n: int) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


def percent(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [
        all(re.fullmatch(r"[-0-9.,%]+( [KMGT]?i?B)?", r[i]) for r in cells) and cells != [] for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        columns = zip(row, widths, numeric, strict=True)
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in columns).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in cells])


def emit(ctx: click.Context, data: Any, human: Callable[[], str]) -> None:
    """Print ``data`` as JSON with ``--json``, else ``human()``."""
    if ctx.obj["json"]:
        click.echo(render(data) if isinstance(data, BaseModel) else json.dumps(data, indent=2))
    else:
        click.echo(human())


def load_json_argument(value: str) -> Any:
    """A JSON text, or ``@path`` to a file holding one."""
    text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}") from None


#: A function-to-function decorator, as click's options are.
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def model_from[M: BaseModel](model: type[M], data: Any, what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or what
        raise click.BadParameter(f"{what}: field '{where}': {first['msg']}") from None


# ---------------------------------------------------------------- plumbing


def client_of(ctx: click.Context) -> KvcmClient:
    if "client" not in ctx.obj:
        ctx.obj["client"] = ctx.with_resource(
            KvcmClient(ctx.obj["url"], ctx.obj["token"], timeout_s=ctx.obj["timeout"])
        )
    client: KvcmClient = ctx.obj["client"]
    return client


def api_command[**P, R](func: Callable[P, R]) -> Callable[P, R]:
    """Maps the client's exceptions to one line and an exit code."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except AuthError as exc:
            raise Failure(
                f"refused (HTTP {exc.http_status}): {exc.message or exc.code.name}; "
                "set KVCM_TOKEN to an account's user:password",
                EXIT_REFUSED,
            ) from None
        except KvcmError as exc:
            raise Failure(str(exc), EXIT_ERROR) from None
        except (TransportError, ProtocolError) as exc:
            url = click.get_current_context().obj["url"]
            raise Failure(f"cannot reach KVCM at {url}: {exc}", EXIT_UNREACHABLE) from None

    return run


def options(*decorators: Decorator) -> Decorator:
    """Several click options as one decorator."""

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def name_command(group: click.Group, name: str, doc: str, method: str, field: str, noun: str, done: str) -> None:
    """``kvcm <noun> <name> NAME``: one API call naming the entity in ``field``."""

    @group.command(name, help=doc)
    @click.argument("entity", metavar="NAME")
    @click.pass_context
    @api_command
    def run(ctx: click.Context, entity: str) -> None:
        getattr(client_of(ctx), method)(**{field: entity})
        emit(ctx, {done: entity}, lambda: f"{noun} {entity} {done}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar="KVCM_URL", default=DEFAULT_URL, show_default=True, help="The API's base URL (env KVCM_URL)."
)
@click.option(
    "--token",
    envvar="KVCM_TOKEN",
    default="",
    show_default=False,
    help="Bearer of an account, user:password (env KVCM_TOKEN).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the API's JSON instead of tables: proto3 JSON, so int64 values are strings "
    "(jq: '.used_bytes | tonumber').",
)
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds per request.")
@click.pass_context
def cli(ctx: click.Context, url: str, token: str, as_json: bool, timeout: float) -> None:
    """Manage and inspect a KVCM service: storages, instance groups, instances, accounts,
    usage, health, metrics, traces and the event log."""
    ctx.obj = {"url": url, "token": token, "json": as_json, "timeout": timeout}


# ---------------------------------------------------------------- storage


def storage_rows(storages: Iterable[m.StorageConfig]) -> list[list[Any]]:
    rows = []
    for s in storages:
        spec = s.spec
        where = (
            (
                getattr(spec, "root_path", "")
                or getattr(spec, "bucket", "")
                or getattr(spec, "mountpoint", "")
                or getattr(spec, "domain", "")
                or getattr(spec, "master_service_entry", "")
            )
            if spec
            else ""
        )
        rows.append([s.global_unique_name, s.storage_type.name, where])
    return rows


def storage_config(
    name: str, nfs: str | None, s3: str | None, key_count_per_file: int, config: str | None
) -> m.StorageConfig:
    chosen = [o for o in (nfs, s3, config) if o]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --nfs ROOT, --s3 BUCKET[/PREFIX] or --config JSON")
    if config:
        data = load_json_argument(config)
        if isinstance(data, dict):
            data.setdefault("global_unique_name", name)
        return model_from(m.StorageConfig, data, "--config")
    if nfs:
        return m.StorageConfig(
            global_unique_name=name, nfs=m.NfsStorageSpec(root_path=nfs, key_count_per_file=key_count_per_file)
        )
    assert s3, "exactly one of --nfs, --s3 and --config is given"
    bucket, _, prefix = s3.partition("/")
    return m.StorageConfig(global_unique_name=name, s3=m.S3StorageSpec(bucket=bucket, prefix=prefix))


@cli.group()
def storage() -> None:
    """Storages (listStorage, addStorage, updateStorage, removeStorage...)."""


@storage.command("list")
@click.pass_context
@api_command
def storage_list(ctx: click.Context) -> None:
    """Every storage, with its health as checkHealth reports it (and why, when not HEALTHY)."""
    client = client_of(ctx)
    answer = client.list_storage()
    if ctx.obj["json"]:  # listStorage's answer; `kvcm --json health` has the storages' health
        click.echo(render(answer))
        return
    health = {s.storage_unique_name: s for s in client.check_health().storages}
    rows = [
        [*row, *((health[row[0]].status, health[row[0]].reason) if row[0] in health else ("-", ""))]
        for row in storage_rows(answer.storage)
    ]
    click.echo(table(["NAME", "TYPE", "WHERE", "HEALTH", "REASON"], rows))


@storage.command("get")
@click.argument("name")
@click.pass_context
@api_command
def storage_get(ctx: click.Context, name: str) -> None:
    """One storage's configuration."""
    found = [s for s in client_of(ctx).list_storage().storage if s.global_unique_name == name]
    if not found:
        raise Failure(f"no storage named {name!r}", EXIT_ERROR)
    emit(ctx, found[0], lambda: json.dumps(json.loads(render(found[0])), indent=2))


storage_spec_options = options(
    click.option("--nfs", metavar="ROOT", help="A file (NFS) storage rooted at ROOT."),
    click.option("--s3", metavar="BUCKET[/PREFIX]", help="An S3 storage."),
    click.option("--key-count-per-file", type=int, default=8, show_default=True, help="Blocks per file (--nfs)."),
    click.option("--config", metavar="JSON|@FILE", help="A whole StorageConfig (API.md)."),
)


@storage.command("add")
@click.argument("name")
@storage_spec_options
@click.pass_context
@api_command
def storage_add(ctx: click.Context, name: str, nfs: str, s3: str, key_count_per_file: int, config: str) -> None:
    """Add storage NAME."""
    client_of(ctx).add_storage(storage=storage_config(name, nfs, s3, key_count_per_file, config))
    emit(ctx, {"added": name}, lambda: f"storage {name} added")


@storage.command("update")
@click.argument("name")
@storage_spec_options
@click.option("--force", is_flag=True, help="force_update: also when groups use it.")
@click.pass_context
@api_command
def storage_update(
    ctx: click.Context, name: str, nfs: str, s3: str, key_count_per_file: int, config: str, force: bool
) -> None:
    """Replace storage NAME's configuration."""
    client_of(ctx).update_storage(storage=storage_config(name, nfs, s3, key_count_per_file, config), force_update=force)
    emit(ctx, {"updated": name}, lambda: f"storage {name} updated")


name_command(
    storage,
    "remove",
    "Remove storage NAME (refused while a group lists it).",
    "remove_storage",
    "storage_unique_name",
    "storage",
    "removed",
)
name_command(
    storage,
    "enable",
    "Let storage NAME take writes and serve reads again.",
    "enable_storage",
    "storage_unique_name",
    "storage",
    "enabled",
)
name_command(
    storage,
    "disable",
    "Stop writes to and reads from storage NAME.",
    "disable_storage",
    "storage_unique_name",
    "storage",
    "disabled",
)


# ---------------------------------------------------------------- group


def group_rows(groups: Iterable[m.InstanceGroup]) -> list[list[Any]]:
    return [
        [
            g.name,
            ",".join(g.storage_candidates),
            human_size(g.quota.capacity) if g.quota else "-",
            g.max_instance_count or "-",
            g.version,
        ]
        for g in groups
    ]


#: A quota below this is almost surely a size given without its unit (``--quota 100``).
MIN_LIKELY_QUOTA = 2**20
WATERMARK_FIELD = "cache_config.reclaim_strategy.trigger_strategy.used_percentage"


def group_doubts(group: m.InstanceGroup, given: dict[str, str] | None = None) -> list[str]:
    """Why each of ``group``'s settings is almost surely a mistake (the API takes them:
    upstream's semantics): a watermark above 1 (reclaim never starts), a quota under
    ``MIN_LIKELY_QUOTA``. ``given`` names the option a field came from (else the field)."""
    given = given or {}
    doubts = []
    quotas = [("quota.capacity", group.quota.capacity if group.quota else 0)]
    quotas += [
        (f"quota.quota_config[{i}].capacity", entry.capacity)
        for i, entry in enumerate(group.quota.quota_config if group.quota else ())
    ]
    for field, capacity in quotas:
        if 0 < capacity < MIN_LIKELY_QUOTA:
            label = given.get(field, f"{field} {capacity}")
            doubts.append(f"{label} is {capacity} bytes, under 1 MiB: give a unit (e.g. 100GiB)")
    strategy = group.cache_config.reclaim_strategy if group.cache_config else None
    trigger = strategy.trigger_strategy if strategy else None
    if trigger is not None and trigger.used_percentage > 1:
        value = trigger.used_percentage
        label = given.get(WATERMARK_FIELD, f"{WATERMARK_FIELD} {value:g}")
        meant = f"; for {value:g} % give {value / 100:g} or {value:g}%" if value <= 100 else ""
        doubts.append(
            f"{label} is a fraction of the quota: above 1 reclaim never starts (upstream's way to switch it off){meant}"
        )
    return doubts


def refuse_doubts(
    config: m.InstanceGroup | None, storages: Sequence[str], quota: str | None, watermark: str | None, force: bool
) -> None:
    """Refuses (exit 2) what this command sets that ``group_doubts`` finds, unless ``force``."""
    given = apply_group_options(config or m.InstanceGroup(), storages, quota, watermark, None)
    names = {"quota.capacity": f"--quota {quota}"} if quota is not None else {}
    if watermark is not None:
        names[WATERMARK_FIELD] = f"--watermark {watermark}"
    doubts = group_doubts(given, names)
    if doubts and not force:
        raise Failure("; ".join(doubts) + "; pass --force to apply it as given", EXIT_USAGE)


def apply_group_options(
    group: m.InstanceGroup,
    storages: Sequence[str],
    quota: str | None,
    watermark: str | None,
    max_instances: int | None,
) -> m.InstanceGroup:
    if storages:
        group.storage_candidates = list(storages)
    if quota is not None:
        group.quota = group.quota or m.InstanceGroupQuota()
        group.quota.capacity = parse_size(quota)
    if watermark is not None:
        group.cache_config = group.cache_config or m.CacheConfig()
        strategy = group.cache_config.reclaim_strategy = group.cache_config.reclaim_strategy or m.CacheReclaimStrategy()
        strategy.trigger_strategy = strategy.trigger_strategy or m.TriggerStrategy()
        strategy.trigger_strategy.used_percentage = parse_watermark(watermark)
    if max_instances is not None:
        group.max_instance_count = max_instances
    return group


group_options = options(
    click.option("--storage", "storages", multiple=True, metavar="NAME", help="A candidate storage (repeat)."),
    click.option("--quota", metavar="SIZE", help="quota.capacity, e.g. 100GiB."),
    click.option(
        "--watermark",
        metavar="FRACTION|PERCENT%",
        help="Where reclaim starts, of the quota: 0.9 or 90%. Above 1 it never starts (refused without --force).",
    ),
    click.option("--max-instances", type=int, help="max_instance_count."),
    click.option(
        "--config", metavar="JSON|@FILE", help="A whole InstanceGroup (API.md); the options above are applied on top."
    ),
    click.option(
        "--force", is_flag=True, help="Apply a watermark above 1 (reclaim off) or a quota under 1 MiB as given."
    ),
)


@cli.group()
def group() -> None:
    """Instance groups (listInstanceGroup, createInstanceGroup, updateInstanceGroup...)."""


@group.command("list")
@click.pass_context
@api_command
def group_list(ctx: click.Context) -> None:
    """Every instance group."""
    answer = client_of(ctx).list_instance_group()
    emit(
        ctx,
        answer,
        lambda: table(["NAME", "STORAGES", "QUOTA", "MAX INSTANCES", "VERSION"], group_rows(answer.instance_group)),
    )


@group.command("get")
@click.argument("name")
@click.pass_context
@api_command
def group_get(ctx: click.Context, name: str) -> None:
    """One group's configuration."""
    stored = fetched_group(client_of(ctx), name)
    emit(ctx, stored, lambda: json.dumps(json.loads(render(stored)), indent=2))


def fetched_group(client: KvcmClient, name: str) -> m.InstanceGroup:
    """Group ``name`` as the server has it."""
    stored = client.get_instance_group(name=name).instance_group
    if stored is None:
        raise Failure(f"KVCM answered without instance group {name!r}", EXIT_ERROR)
    return stored


@group.command("add")
@click.argument("name")
@group_options
@click.pass_context
@api_command
def group_add(
    ctx: click.Context,
    name: str,
    storages: tuple[str, ...],
    quota: str | None,
    watermark: str | None,
    max_instances: int | None,
    config: str,
    force: bool,
) -> None:
    """Create instance group NAME."""
    given = model_from(m.InstanceGroup, load_json_argument(config), "--config") if config else None
    refuse_doubts(given, storages, quota, watermark, force)
    base = given or m.InstanceGroup()
    base.name = name
    client_of(ctx).create_instance_group(
        instance_group=apply_group_options(base, storages, quota, watermark, max_instances)
    )
    emit(ctx, {"added": name}, lambda: f"group {name} created")


@group.command("update")
@click.argument("name")
@group_options
@click.pass_context
@api_command
def group_update(
    ctx: click.Context,
    name: str,
    storages: tuple[str, ...],
    quota: str | None,
    watermark: str | None,
    max_instances: int | None,
    config: str,
    force: bool,
) -> None:
    """Change group NAME: read it, apply the options, write it back at the next version."""
    given = model_from(m.InstanceGroup, load_json_argument(config), "--config") if config else None
    refuse_doubts(given, storages, quota, watermark, force)
    client = client_of(ctx)
    current = fetched_group(client, name)
    base = given or current.model_copy(deep=True)
    base.name, base.version = name, current.version + 1
    client.update_instance_group(
        instance_group=apply_group_options(base, storages, quota, watermark, max_instances),
        current_version=current.version,
    )
    emit(ctx, {"updated": name, "version": base.version}, lambda: f"group {name} updated to version {base.version}")


name_command(
    group,
    "remove",
    "Remove group NAME (refused while it has instances).",
    "remove_instance_group",
    "name",
    "group",
    "removed",
)


# ---------------------------------------------------------------- instance


@cli.group()
def instance() -> None:
    """Instances (listInstanceInfo, getInstanceInfo, registerInstance, removeInstance)."""


@instance.command("list")
@click.option("--group", "group_name", default="", help="Only this group's instances.")
@click.pass_context
@api_command
def instance_list(ctx: click.Context, group_name: str) -> None:
    """Registered instances."""
    answer = client_of(ctx).list_instance_info(instance_group_name=group_name)
    emit(
        ctx,
        answer,
        lambda: table(
            ["INSTANCE", "GROUP", "BLOCK SIZE", "SPECS", "MODEL"],
            [
                [
                    i.instance_id,
                    i.instance_group_name,
                    i.block_size,
                    ",".join(f"{s.name}={human_size(s.size)}" for s in i.location_spec_infos),
                    i.model_deployment.model_name if i.model_deployment else "",
                ]
                for i in answer.instance_info
            ],
        ),
    )


@instance.command("get")
@click.argument("instance_id")
@click.pass_context
@api_command
def instance_get(ctx: click.Context, instance_id: str) -> None:
    """One instance's registration."""
    answer = client_of(ctx).get_instance_info(instance_id=instance_id)
    emit(ctx, answer, lambda: json.dumps(json.loads(render(answer)), indent=2))


@instance.command("add")
@click.argument("instance_id")
@click.option("--group", "group_name", required=True, help="Its instance group.")
@click.option("--block-size", type=int, required=True, help="Tokens per block.")
@click.option(
    "--spec",
    "specs",
    multiple=True,
    required=True,
    metavar="NAME=SIZE",
    help="A location spec and its bytes per block, e.g. tp0=1MiB (repeat).",
)
@click.option("--model", required=True, help="model_deployment.model_name")
@click.option("--dtype", required=True, help="model_deployment.dtype")
@click.pass_context
@api_command
def instance_add(
    ctx: click.Context,
    instance_id: str,
    group_name: str,
    block_size: int,
    specs: tuple[str, ...],
    model: str,
    dtype: str,
) -> None:
    """Register INSTANCE_ID (as an engine would; the same registration again is OK)."""
    infos = []
    for spec in specs:
        name, sep, size = spec.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{spec!r} is not NAME=SIZE", param_hint="--spec")
        infos.append(m.LocationSpecInfo(name=name, size=parse_size(size)))
    client_of(ctx).register_instance(
        instance_group=group_name,
        instance_id=instance_id,
        block_size=block_size,
        location_spec_infos=infos,
        model_deployment=m.ModelDeployment(model_name=model, dtype=dtype),
    )
    emit(ctx, {"added": instance_id}, lambda: f"instance {instance_id} registered in {group_name}")


@instance.command("remove")
@click.argument("instance_id")
@click.option("--group", "group_name", default="", help="Its group (looked up when absent).")
@click.pass_context
@api_command
def instance_remove(ctx: click.Context, instance_id: str, group_name: str) -> None:
    """Remove INSTANCE_ID and all of its cache (data and metadata)."""
    client = client_of(ctx)
    group_name = group_name or client.get_instance_info(instance_id=instance_id).instance_group
    client.remove_instance(instance_group=group_name, instance_id=instance_id)
    emit(ctx, {"removed": instance_id}, lambda: f"instance {instance_id} removed")


# ---------------------------------------------------------------- account


@cli.group()
def account() -> None:
    """Accounts (listAccount, addAccount, deleteAccount)."""


@account.command("list")
@click.pass_context
@api_command
def account_list(ctx: click.Context) -> None:
    """Every account (never their secrets)."""
    answer = client_of(ctx).list_account()
    emit(ctx, answer, lambda: table(["USER", "ROLE"], [[a.user_name, a.role.name] for a in answer.accounts]))


@account.command("add")
@click.argument("user_name")
@click.option("--role", type=click.Choice(["user", "admin"]), default="user", show_default=True)
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from stdin (else env KVCM_NEW_PASSWORD, else a prompt)."
)
@click.pass_context
@api_command
def account_add(ctx: click.Context, user_name: str, role: str, password_stdin: bool) -> None:
    """Add account USER_NAME."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = os.environ.get("KVCM_NEW_PASSWORD") or (
            click.prompt("password", hide_input=True, confirmation_prompt=True) if sys.stdin.isatty() else ""
        )
    if not password:
        raise Failure("no password: use --password-stdin, KVCM_NEW_PASSWORD or a terminal", EXIT_USAGE)
    client_of(ctx).add_account(
        user_name=user_name, password=password, role=Role.ROLE_ADMIN if role == "admin" else Role.ROLE_USER
    )
    emit(ctx, {"added": user_name}, lambda: f"account {user_name} ({role}) added")


name_command(account, "remove", "Delete account NAME.", "delete_account", "user_name", "account", "removed")


# ---------------------------------------------------------------- usage, health, metrics


def reclaim_off(usage: m.InstanceGroupUsage) -> bool:
    """Whether the group's watermark lies above its quota: reclaim never starts."""
    return 0 < usage.capacity < usage.watermark_bytes


def watermark_cell(usage: m.InstanceGroupUsage) -> str:
    if reclaim_off(usage):
        return f"off ({human_size(usage.watermark_bytes)} > quota)"
    return human_size(usage.watermark_bytes) if usage.watermark_bytes else "-"


def usage_rows(groups: Iterable[m.InstanceGroupUsage], top: int) -> list[list[Any]]:
    rows = []
    for g in groups:
        leaders = ", ".join(f"{i.instance_id} {human_size(i.used_bytes)}" for i in g.instances[:top])
        rows.append(
            [
                g.name,
                human_size(g.capacity) if g.capacity else "unlimited",
                human_size(g.used_bytes),
                percent(g.used_bytes, g.capacity),
                watermark_cell(g),
                f"{g.key_count:,}",
                len(g.instances),
                leaders,
            ]
        )
    return rows


@cli.command()
@click.option("--group", "group_name", default="", help="Only this group.")
@click.option("--top", type=int, default=3, show_default=True, help="Instances listed per group.")
@click.pass_context
@api_command
def usage(ctx: click.Context, group_name: str, top: int) -> None:
    """How full each group is: quota, used, watermark (or "off"), keys, top instances."""
    answer = client_of(ctx).get_instance_group_usage(instance_group_name=group_name)

    def human() -> str:
        lines = [
            table(
                ["GROUP", "QUOTA", "USED", "USED %", "WATERMARK", "KEYS", "INSTANCES", "TOP INSTANCES"],
                usage_rows(answer.usage, top),
            )
        ]
        lines += [
            f"reclaim is off in group {g.name}: its watermark ({human_size(g.watermark_bytes)}) is above its quota "
            f"({human_size(g.capacity)}), so a full group refuses writes; set it with "
            f"`kvcm group update {g.name} --watermark 0.9`"
            for g in answer.usage
            if reclaim_off(g)
        ]
        return "\n".join(lines)

    emit(ctx, answer, human)


@cli.command()
@click.pass_context
@api_command
def health(ctx: click.Context) -> None:
    """checkHealth and the lease holder: why it is unhealthy, each storage's health and the
    groups with a storage out of service; exit code 5 when unhealthy."""
    client = client_of(ctx)
    answer = client.check_health()
    cluster = client.get_manager_cluster_info()
    data = {
        "is_health": answer.is_health,
        "is_leader": answer.is_leader,
        "self_node_id": cluster.self_node_id,
        "leader_node_id": cluster.leader_node_id,
        "problems": answer.problems,
        "storages": [s.model_dump() for s in answer.storages],
        "degraded_groups": [g.model_dump() for g in answer.degraded_groups],
    }

    def human() -> str:
        summary = table(
            ["HEALTHY", "LEADER HERE", "NODE", "LEADER"],
            [
                [
                    "yes" if answer.is_health else "NO",
                    "yes" if answer.is_leader else "no",
                    cluster.self_node_id,
                    cluster.leader_node_id or "-",
                ]
            ],
        )
        parts = [summary, *(f"UNHEALTHY: {problem}" for problem in answer.problems)]
        if answer.storages:
            rows = [[s.storage_unique_name, s.status, s.reason] for s in answer.storages]
            parts += ["", table(["STORAGE", "HEALTH", "REASON"], rows)]
        if answer.degraded_groups:
            rows = [[g.instance_group_name, g.status, g.reason] for g in answer.degraded_groups]
            parts += ["", table(["GROUP", "HEALTH", "REASON"], rows)]
        return "\n".join(parts)

    emit(ctx, data, human)
    if not answer.is_health:
        ctx.exit(EXIT_UNHEALTHY)


@cli.command()
@click.option("--prometheus", is_flag=True, help="The text exposition of GET /metrics instead.")
@click.option("--filter", "pattern", default="", help="Only metrics whose name contains this.")
@click.pass_context
@api_command
def metrics(ctx: click.Context, prometheus: bool, pattern: str) -> None:
    """The service's metrics (getMetrics)."""
    client = client_of(ctx)
    if prometheus:
        click.echo(client.prometheus_metrics(), nl=False)
        return
    answer = client.get_metrics()
    answer.metrics = [p for p in answer.metrics if pattern in p.metric_name]

    def value(point: m.MetricsData) -> str:
        v = point.metric_value
        if v is None:
            return ""
        return (
            str(v.int_value)
            if v.int_value is not None
            else (f"{v.float_value:g}" if v.float_value is not None else v.string_value or "")
        )

    emit(
        ctx,
        answer,
        lambda: table(
            ["METRIC", "TAGS", "VALUE"],
            [
                [p.metric_name, ",".join(f"{t.tag_key}={t.tag_value}" for t in p.metric_tags), value(p)]
                for p in sorted(answer.metrics, key=lambda p: (p.metric_name, [t.tag_value for t in p.metric_tags]))
            ],
        ),
    )


# ---------------------------------------------------------------- trace (the optimizer)


class Ticker:
    """Elapsed time on stderr while long work runs (only on a terminal)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if sys.stderr.isatty() else None

    def _run(self) -> None:
        start = time.monotonic()
        while not self._done.wait(0.5):
            click.echo(f"\r{self.what}: {time.monotonic() - start:5.1f} s", err=True, nl=False)
        click.echo("\r\033[K", err=True, nl=False)

    def __enter__(self) -> Ticker:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def optimizer_command(name: str, summary: str) -> click.Command:
    @click.command(
        name,
        help=f"{summary} (python -m chalicelib.optimizer {name}; `kvcm trace {name} --help` for its options).",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def run(ctx: click.Context, args: tuple[str, ...]) -> None:
        from chalicelib.optimizer.cli import main

        argv = [name, *args]
        if ctx.find_root().obj["json"] and name in ("replay", "mrc", "sweep") and "--json" not in args:
            argv.append("--json")
        with Ticker(f"trace {name}"):
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
                status = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        ctx.exit(status)

    return run


@cli.group()
def trace() -> None:
    """Size caches from traces with the optimizer (Mooncake, Qwen-Bailian, KVCM event logs...)."""


trace.add_command(optimizer_command("replay", "Replay a trace at one capacity with one policy"))
trace.add_command(optimizer_command("mrc", "Exact prefix-aware LRU hit ratio at many capacities in one pass"))
trace.add_command(optimizer_command("sweep", "Replay policies x capacities"))
trace.add_command(optimizer_command("report", "Capacity report: JSON, PNG plots and a recommendation"))


# ---------------------------------------------------------------- events


def event_line(raw: str) -> str | None:
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    when = time.strftime("%H:%M:%S", time.gmtime(int(event.get("trigger_time_us", 0)) / 1e6))
    keys = event.get("keys") or event.get("block_keys") or []
    detail = event.get("query_type") or event.get("write_session_id") or ""
    return f"{when}  {event.get('type', '?'):<20} {event.get('source', ''):<20} {len(keys):>6} keys  {detail}"


@cli.group()
def events() -> None:
    """The event log (KVCM_EVENT_LOG: one upstream event-log JSON line per meta call)."""


@events.command("tail")
@click.option(
    "--file",
    "path",
    envvar="KVCM_EVENT_LOG",
    type=click.Path(dir_okay=False),
    required=True,
    help="The event log (env KVCM_EVENT_LOG).",
)
@click.option("-n", "--lines", type=int, default=20, show_default=True, help="Last lines to show first.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events (Ctrl-C to stop).")
@click.option("--poll", type=float, default=0.5, show_default=True, help="Seconds between reads with --follow.")
@click.pass_context
def events_tail(ctx: click.Context, path: str, lines: int, follow: bool, poll: float) -> None:
    """The last events, then (with -f) new ones as they are written."""
    as_json = ctx.find_root().obj["json"]
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise Failure(f"cannot read the event log {path}: {exc.strerror}", EXIT_USAGE) from None

    def show(raw: str) -> None:
        text = raw.rstrip("\n") if as_json else event_line(raw)
        if text:
            click.echo(text)

    with handle:
        for raw in list(handle)[-lines:] if lines > 0 else []:
            show(raw)
        handle.seek(0, os.SEEK_END)
        while follow:
            raw = handle.readline()
            if raw.endswith("\n"):
                show(raw)
            else:
                if raw:
                    handle.seek(handle.tell() - len(raw.encode()))
                time.sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kvcm`` entry point; returns the exit code. Every error is one line on stderr."""
    try:
        status = cli.main(args=list(argv) if argv is not None else None, prog_name="kvcm", standalone_mode=False)
    except Failure as exc:
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        hint = f" (see {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        click.echo(f"kvcm: error: {exc.format_message()}{hint}", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        click.echo(f"kvcm: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("kvcm: error: aborted", err=True)
        return EXIT_ERROR
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
