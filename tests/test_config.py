"""Config parsing: defaults, sizes, and errors that name the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from mooncake_sgl.cli import main as cli_main
from mooncake_sgl.config import (
    ConfigError,
    HostTierConfig,
    LmdbTierConfig,
    StoreConfig,
    load_config,
    load_config_file,
    parse_config,
    parse_duration,
    parse_size,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_no_config_is_the_embedded_default_dram_plus_lmdb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_SGL_CONFIG", raising=False)
    config = load_config(None)
    assert [type(t) for t in config.tiers] == [HostTierConfig, LmdbTierConfig]
    assert config == StoreConfig()


@pytest.mark.parametrize("text,expected", [
    ("64GiB", 64 << 30), ("512MiB", 512 << 20), ("10GB", 10 * 10**9), ("1.5KiB", 1536), (4096, 4096),
    (" 2 gib ", 2 << 30),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text,expected", [("250ms", 0.25), ("5s", 5.0), ("2m", 120.0), (3, 3.0)])
def test_durations(text: object, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("data,key,words", [
    ({"tiers": [{"kind": "host", "capacity": "12XB"}]}, "tiers[0].capacity", "expected a size"),
    ({"tiers": [{"kind": "host", "capacity": -1}]}, "tiers[0].capacity", "negative"),
    ({"tiers": [{"kind": "host", "colour": "red"}]}, "tiers[0].colour", "unknown field"),
    ({"polcy": {"name": "lru"}}, "polcy", "unknown field"),
    ({"tiers": [{"kind": "nvme"}]}, "tiers[0].kind", "tier kinds"),
    ({"policy": {"name": "fifo"}}, "policy.name", "fifo"),
    ({"tiers": [{"kind": "lmdb", "capacity": "1KiB"}]}, "tiers[0].capacity", "at least 1MiB"),
    ({"tiers": [{"kind": "pool", "endpoints": []}]}, "tiers[0].endpoints", "at least one endpoint"),
    ({"tiers": [{"kind": "pool", "timeout": "soon"}]}, "tiers[0].timeout", "duration"),
])
def test_bad_values_name_the_key_and_source(data: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "tiers.yaml")
    assert info.value.key == key
    assert "tiers.yaml" in str(info.value)
    assert words in str(info.value)


def test_impossible_tier_order_is_refused() -> None:
    with pytest.raises(ConfigError, match="fastest first"):
        parse_config({"tiers": [{"kind": "lmdb"}, {"kind": "host"}]}, "x.yaml")


def test_duplicate_tier_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        parse_config({"tiers": [{"kind": "host"}, {"kind": "host"}]}, "x.yaml")


def test_malformed_yaml_names_line_and_file(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("tiers: [\n")
    with pytest.raises(ConfigError, match=r"malformed YAML line 2.*broken.yaml"):
        load_config_file(f)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config_file(tmp_path / "nope.yaml")


def test_extra_config_from_sglang_ignores_sglang_own_keys() -> None:
    config = load_config({"interface_v1": 1, "backend_name": "x", "module_path": "m", "class_name": "C",
                          "tiers": [{"kind": "host", "capacity": "1GiB"}]})
    assert config.tiers == [HostTierConfig(capacity=1 << 30)]


def test_env_var_names_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("tiers:\n  - kind: host\n    capacity: 2GiB\n")
    monkeypatch.setenv("MOONCAKE_SGL_CONFIG", str(f))
    assert load_config({}).tiers == [HostTierConfig(capacity=2 << 30)]


@pytest.mark.parametrize("path", sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("pool")),
                         ids=lambda p: p.name)
def test_shipped_tier_examples_are_valid(path: Path) -> None:
    load_config_file(path)


def test_cli_config_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("tiers:\n  - kind: host\n    capacity: 1GiB\n")
    bad.write_text("tiers:\n  - kind: host\n    capacity: lots\n")
    assert cli_main(["config", "check", str(good)]) == 0
    assert cli_main(["config", "check", str(bad)]) == 2
    assert "tiers[0].capacity" in capsys.readouterr().err


def test_shipped_pool_server_example_is_valid() -> None:
    from mooncake_sgl.pool.config import PoolServerConfig

    config = load_config_file(CONFIGS / "pool.yaml", PoolServerConfig)
    assert config.capacity == 16 << 30 and config.port == 7480
