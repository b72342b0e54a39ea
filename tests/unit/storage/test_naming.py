"""Path components, block-key rendering, URI assembly and endpoint parsing."""

import posixpath
import random
import string

import pytest

from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.storage.naming import DECIMAL, HEX64, MAX_COMPONENT, escape_component, hex64, uri_template
from chalicelib.storage.net import parse_endpoints, parse_host_port

UNRESERVED = set(string.ascii_letters + string.digits + "-._~")
HOSTILE = [
    "..",
    ".",
    "../x",
    "a/../../b",
    "/abs",
    "nul\0byte",
    "~",
    "~2F",
    "a/b",
    ".hidden",
    "sp ace",
    "ü",
    "\ud800",
    "%2F",
    "a\\b",
    "\n",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_become_one_harmless_component(name):
    out = escape_component(name)
    assert set(out) <= UNRESERVED
    assert out not in ("", ".", "..") and not out.startswith(".")
    # Joined under a root it stays exactly one level below it.
    assert posixpath.dirname(posixpath.normpath(posixpath.join("/root", out))) == "/root"


def test_plain_names_stay_readable():
    assert escape_component("instance_1-a.b") == "instance_1-a.b"
    assert escape_component("../x") == "~2E.~2Fx"
    assert escape_component("a_b", also="_") == "a~5Fb"


def test_escape_is_injective_on_random_strings():
    rng = random.Random(7)
    alphabet = "ab._-~/%\0ü" + "~2F"
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(20000)}
    escaped = {escape_component(n) for n in names}
    assert len(escaped) == len(names)


def test_long_names_fit_a_file_name_and_stay_distinct():
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    ea, eb = escape_component(a), escape_component(b)
    assert ea != eb
    assert len(ea) <= MAX_COMPONENT and len(eb) <= MAX_COMPONENT
    assert "~~" in ea and "~~" not in escape_component("x" * 10)
    # A head never ends inside an escape sequence.
    long_escapes = escape_component("/" * 300)
    head = long_escapes.split("~~")[0]
    assert len(head) % 3 == 0 and set(head[::3]) == {"~"}


def test_empty_name_is_rejected():
    with pytest.raises(InvalidArgumentError):
        escape_component("")


def test_hex64_is_fixed_width_twos_complement():
    assert hex64(255) == "00000000000000ff"
    assert hex64(-1) == "ffffffffffffffff"
    assert hex64(-(2**63)) == "8000000000000000"


def test_uri_template_encodes_path_and_values_and_keeps_placeholders():
    template = uri_template(
        "file", "nfs_01", ("/mnt/a b/x~2F/", HEX64), [("key", ("a&b=c", DECIMAL)), ("size", 10), ("100%", "50%")]
    )
    assert template % (255, 7) == "file://nfs_01/mnt/a%20b/x~2F/00000000000000ff?key=a%26b%3Dc7&size=10&100%25=50%25"


def test_uri_template_doubles_a_literal_percent_in_the_host():
    assert uri_template("s3", "odd%host", "/") % () == "s3://odd%host/"


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("127.0.0.1:50051", [("127.0.0.1", 50051)]),
        ("etcd://a:1;b:2", [("a", 1), ("b", 2)]),
        ("etcd://a:1,b:2;", [("a", 1), ("b", 2)]),
        ("[::1]:9000", [("::1", 9000)]),
        ("host.example:80", [("host.example", 80)]),
    ],
)
def test_parse_endpoints(entry, expected):
    assert parse_endpoints(entry) == expected


@pytest.mark.parametrize("text", ["", "host", "host:", ":80", "host:0", "host:65536", "host:x", "::1:80", "[::1]"])
def test_parse_host_port_rejects(text):
    with pytest.raises(ValueError):
        parse_host_port(text)
