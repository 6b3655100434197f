"""Connectors: built-ins, and third-party ones registered through the entry-point group."""

from __future__ import annotations

import sys
import textwrap

import pytest

from latgate.foundation.config import ConfigError, connector_names, load_config_text
from latgate.foundation.config.schema import EndpointConfig
from latgate.live.connectors import UnknownConnector, get_connector, known_connectors
from latgate.live.connectors.base import BUILTIN


def test_builtin_connectors_are_known_and_address_one_v1() -> None:
    assert known_connectors()[:4] == ["openai", "vllm", "sglang", "tile_rt_connector"]
    endpoint = EndpointConfig(id="p-0", api_base="https://taotoken.net/api")
    assert get_connector("openai").url(endpoint, "/chat/completions") == "https://taotoken.net/api/v1/chat/completions"
    assert get_connector("vllm").running_metric == "vllm:num_requests_running"


def test_the_configs_builtin_names_are_the_builtin_connectors() -> None:
    assert list(connector_names.BUILTIN_NAMES) == list(BUILTIN)


def test_unknown_connector_names_the_known_ones() -> None:
    with pytest.raises(UnknownConnector, match="tile_rt_connector"):
        get_connector("tilert")


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    """A minimal installed distribution declaring a connector in ``latgate.live.connectors``."""
    (tmp_path / "acme_connector.py").write_text(
        textwrap.dedent(
            """
            from latgate.live.connectors import Connector

            class AcmeConnector(Connector):
                name = "acme"
                health_path = "/ping"
            """
        )
    )
    dist = tmp_path / "acme_connector-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-connector\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[latgate.live.connectors]\nacme = acme_connector:AcmeConnector\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    connector_names._plugins.cache_clear()
    yield
    connector_names._plugins.cache_clear()
    sys.modules.pop("acme_connector", None)


def test_third_party_connector_registers_through_the_entry_point_group(plugin_dist) -> None:
    assert "acme" in known_connectors()
    connector = get_connector("acme")
    assert type(connector).__name__ == "AcmeConnector" and connector.health_path == "/ping"
    config = load_config_text(
        '[providers.p]\napi_base = "http://127.0.0.1:1/v1"\nconnector = "acme"\n', source="c.toml", env={}
    )
    assert config.providers["p"].connector == "acme"


def test_config_naming_an_unregistered_connector_fails_to_load() -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text('[providers.p]\napi_base = "http://127.0.0.1:1/v1"\nconnector = "acme"\n', source="c.toml", env={})
    assert "providers.p.connector" in str(err.value) and "openai" in str(err.value)
