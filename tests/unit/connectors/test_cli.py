"""``kvcm-relay``'s arguments: the engine API key (flag or $KVCM_API_KEY) as bearer, one
relay per DP rank on the engines' offset ports."""

from __future__ import annotations

from connectors.__main__ import configs, parser
from connectors.relay import HttpTransport

BASE = ["--endpoint", "tcp://127.0.0.1:5557", "--replay-endpoint", "tcp://127.0.0.1:5600", "--manager", "http://m:8000"]
BASE += ["--instance-id", "i"]


def test_the_api_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.setenv("KVCM_API_KEY", "from-env")
    [(config, _, _)] = configs(parser().parse_args([*BASE, "--host-ip-port", "h:1"]))
    assert HttpTransport(config).headers["Authorization"] == "Bearer from-env"
    [(config, _, _)] = configs(parser().parse_args([*BASE, "--host-ip-port", "h:1", "--api-key", "flag"]))
    assert HttpTransport(config).headers["Authorization"] == "Bearer flag"
    monkeypatch.delenv("KVCM_API_KEY")
    [(config, _, _)] = configs(parser().parse_args([*BASE, "--host-ip-port", "h:1"]))
    assert "Authorization" not in HttpTransport(config).headers


def test_each_dp_rank_gets_its_ports_and_host():
    args = parser().parse_args(
        [*BASE, "--host-ip-port", "10.0.0.8:{dp_rank}", "--dp-size", "3", "--media", "external="]
    )
    planned = configs(args)
    assert [(c.dp_rank, c.host_ip_port, e, r) for c, e, r in planned] == [
        (0, "10.0.0.8:0", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5600"),
        (1, "10.0.0.8:1", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601"),
        (2, "10.0.0.8:2", "tcp://127.0.0.1:5559", "tcp://127.0.0.1:5602"),
    ]
    assert planned[0][0].kvcm_medium("EXTERNAL") == ""
