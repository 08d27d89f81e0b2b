"""Config parsing: defaults, sizes, and errors that name the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from mooncake_sgl.cli import main as cli_main
from mooncake_sgl.config import (
    HostTierConfig,
    LmdbTierConfig,
    StoreConfig,
    parse_duration,
    parse_size,
)
from mooncake_sgl.config_sources import load_config
from mooncake_sgl.config_text import load_config_file, parse_config
from mooncake_sgl.errors import ConfigError

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
    # A heat knob under another policy (the default is adaptive) would be silently ignored.
    ({"policy": {"admission_min_hits": 3}}, "policy.admission_min_hits", "add `name: heat`"),
    ({"policy": {"name": "lru", "sketch": "decay"}}, "policy.sketch", "only the heat policy"),
    # LRU keeps no pins: they were silently ignored.
    ({"policy": {"name": "lru", "pins": [{"prefix_hash": "ab"}]}}, "policy.pins", "lru policy keeps no pins"),
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


def test_every_tier_kind_has_a_speed_and_the_error_lists_them_in_order() -> None:
    import typing

    from mooncake_sgl.config import TIER_SPEED, TierConfig, tier_kind

    kinds = {t.__struct_config__.tag for t in typing.get_args(TierConfig)}
    assert set(TIER_SPEED) == kinds
    assert tier_kind(HostTierConfig()) == "host"
    with pytest.raises(ConfigError, match="hbm, host, pool/mooncake_store, lmdb"):
        parse_config({"tiers": [{"kind": "lmdb"}, {"kind": "hbm", "capacity": "1GiB"}]}, "x.yaml")


def test_pins_are_kept_by_the_policies_that_pin() -> None:
    for name in ("adaptive", "heat"):
        assert parse_config({"policy": {"name": name, "pins": [{"prefix_hash": "ab"}]}}, "x").policy.pins


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


def test_config_check_names_malformed_yaml_in_an_at_file(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "tiers.yaml"
    bad.write_text("tiers: [1,\n")  # yaml.YAMLError is no ValueError: it ended in a traceback
    assert cli_main(["config", "check", "--extra-config", f"@{bad}"]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON or YAML" in err and str(bad) in err


def test_config_check_warns_a_pd_decode_with_offload_of_the_at_file_form(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang's decode offload manager parses the extra-config with a bare json.loads: "@FILE" there
    # stops the decode at start; the config_file key names the same file in JSON.
    import json as _json

    good = tmp_path / "tiers.yaml"
    good.write_text("tiers:\n  - kind: host\n    capacity: 1GiB\n")
    assert cli_main(["config", "check", "--extra-config", f"@{good}", "--decode-offload"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "bare JSON" in err and _json.dumps({"config_file": str(good)}) in err
    inline = _json.dumps({"config_file": str(good)})
    assert cli_main(["config", "check", "--extra-config", inline, "--decode-offload"]) == 0
    out = capsys.readouterr()
    assert "warning" not in out.err and out.out.startswith("ok:")
    assert cli_main(["config", "check", "--extra-config", f"@{good}"]) == 0  # no decode: no warning
    assert "warning" not in capsys.readouterr().err


def test_sglangs_own_keys_in_a_tiers_file_work_in_every_form_and_are_noted_where_they_change_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang reads prefetch_threshold from the @FILE form; a PD decode with offload needs the same
    # file as {"config_file": ...}, which SGLang never opens: the key must not stop the decode.
    from mooncake_sgl.config_sources import resolve_config

    f = tmp_path / "tiers.yaml"
    f.write_text("tiers:\n  - kind: host\n    capacity: 1GiB\nprefetch_threshold: 64\n")
    via_file = resolve_config({"config_file": str(f)}, environ={})
    assert type(via_file.config.tiers[0]).__name__ == "HostTierConfig"
    assert any("prefetch_threshold" in n and "changes nothing" in n for n in via_file.notes)
    via_env = resolve_config(None, environ={"MOONCAKE_SGL_CONFIG": str(f)})
    assert any("named by $MOONCAKE_SGL_CONFIG" in n for n in via_env.notes)
    assert resolve_config({"tiers": [{"kind": "host"}], "prefetch_threshold": 64}, environ={}).notes == ()
    assert cli_main(["config", "check", str(f)]) == 0  # checked as the @FILE form SGLang hands over
    assert "changes nothing" not in capsys.readouterr().out
    f.write_text("tiers:\n  - kind: host\nprefetch_treshold: 64\n")  # a typo is still an error
    with pytest.raises(ConfigError, match="prefetch_treshold"):
        resolve_config({"config_file": str(f)}, environ={})


def test_a_tilde_in_the_ssd_tier_path_is_the_home_directory_and_config_check_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    f = tmp_path / "tiers.yaml"
    f.write_text("tiers:\n  - kind: host\n  - kind: lmdb\n    path: ~/kvcache\n")
    assert load_config_file(f).tiers[1].path == str(tmp_path / "kvcache")
    assert cli_main(["config", "check", str(f)]) == 0
    assert f"lmdb 64GiB at {tmp_path / 'kvcache'}" in capsys.readouterr().out


def test_shipped_pool_server_example_is_valid() -> None:
    from mooncake_sgl.pool.config import PoolServerConfig

    config = load_config_file(CONFIGS / "pool.yaml", PoolServerConfig)
    assert config.capacity == 16 << 30 and config.port == 7480


@pytest.mark.parametrize("data,key,words", [
    ({"tiers": [{"kind": "host", "capacity": "99999999999999TiB"}]}, "tiers[0].capacity",
     "larger than any machine"),
    ({"tiers": [{"kind": "host", "capacity": 10**30}]}, "tiers[0].capacity", "larger than any"),
    ({"tiers": [{"kind": "lmdb", "max_readers": -1}]}, "tiers[0].max_readers", "between 1 and"),
    ({"tiers": [{"kind": "lmdb", "max_readers": 10**12}]}, "tiers[0].max_readers", "between 1"),
    ({"tiers": [{"kind": "pool", "endpoints": ["10.0.0.5"]}]}, "tiers[0].endpoints", "host:port"),
    ({"tiers": [{"kind": "pool", "endpoints": ["h:99999"]}]}, "tiers[0].endpoints", "1..65535"),
    ({"tiers": [{"kind": "pool", "timeout": 0}]}, "tiers[0].timeout", "longer than 0"),
    ({"tiers": [{"kind": "pool", "retry_after": 10**12}]}, "tiers[0].retry_after", "30 days"),
    ({"tiers": [{"kind": "host", "capacity": 0}]}, "tiers[0].capacity", "positive capacity"),
    ({"tiers": [{"kind": "host", "slot_size": 0}]}, "tiers[0].slot_size", "must be positive"),
    ({"tiers": [{"kind": "hbm", "capacity": "1GiB", "slot_size": 0}]}, "tiers[0].slot_size",
     "must be positive"),
])
def test_out_of_range_values_name_the_key_instead_of_failing_at_build_time(
        data: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "tiers.yaml")
    assert info.value.key == key and words in str(info.value)


def test_a_non_utf8_file_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"tiers:\n  - kind: host\n    # caf\xe9\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text: byte 0xe9 on line 3.*latin1.yaml"):
        load_config_file(f)


def test_a_key_given_twice_is_an_error_not_last_one_wins(tmp_path: Path) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text("tiers:\n  - kind: host\n    capacity: 1GiB\n    capacity: 2GiB\n")
    with pytest.raises(ConfigError, match=r"line 4 .*duplicate key 'capacity'.*dup.yaml"):
        load_config_file(f)


@pytest.mark.parametrize("data,key,words", [
    ({"slab_size": 1000}, "slab_size", "multiple of 4096"),
    ({"log_level": "LOUD"}, "log_level", "one of DEBUG"),
    ({"max_connections": 0}, "max_connections", "at least 1"),
    ({"max_handshakes": 0}, "max_handshakes", "at least 1"),
    ({"handshake_timeout": 0}, "handshake_timeout", "longer than 0"),
    ({"hold_timeout": "0s"}, "hold_timeout", "longer than 0"),
    ({"max_frame_bytes": "1MiB"}, "max_frame_bytes", "at least slab_size"),
    ({"put_wait": "30s"}, "put_wait", "shorter than request_timeout"),
    ({"capacity": "1GiB", "tenants": [{"name": "a", "secret": "", "capacity": "64MiB"}]},
     "tenants[0].secret", "own non-empty secret"),
    ({"capacity": "1GiB", "secret": "x", "tenants": [{"name": "a", "secret": "s", "capacity": "64MiB"}]},
     "secret", "each tenant has its own secret"),
    ({"capacity": "100MiB", "tenants": [{"name": "a", "secret": "s", "capacity": "64MiB"},
                                        {"name": "b", "secret": "t", "capacity": "64MiB"}]},
     "capacity", "add up to"),
    ({"tenants": [{"name": "a", "secret": "s", "capacity": "64MiB"},
                  {"name": "a", "secret": "t", "capacity": "64MiB"}]}, "tenants", "more than once"),
])
def test_pool_server_settings_that_could_not_serve_are_refused(data: dict, key: str,
                                                                words: str) -> None:
    from mooncake_sgl.pool.config import PoolServerConfig

    with pytest.raises(ConfigError) as info:
        parse_config(data, "pool.yaml", PoolServerConfig)
    assert info.value.key == key and words in str(info.value), str(info.value)


def test_config_show_never_prints_a_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pool-tier.yaml"
    f.write_text("tiers:\n  - kind: host\n  - kind: pool\n    secret: hunter2-pool-secret\n")
    assert cli_main(["config", "show", str(f)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "secret: <redacted>" in out
    config = load_config_file(f)
    assert "hunter2" not in repr(config) and "hunter2" not in str(config.tiers[1])  # logs, tracebacks
    assert config.tiers[1].secret == "hunter2-pool-secret"  # only printing hides it


# "Billion laughs": 10**8 strings once aliases are expanded; must fail fast, not expand.
_LAUGHS = "tiers: [\n" + "".join(
    f"  &{a} [{', '.join([f'*{p}'] * 10) if p else ', '.join(['x'] * 10)}],\n"
    for p, a in zip(["", *"abcdefg"], "abcdefgh")) + "  *h]\n"


# Odd YAML where the loader expects names and scalars: each must be a ConfigError (the CLI's exit 2)
# naming the file and the line, never a traceback. (text, line, words)
@pytest.mark.parametrize("text,line,words", [
    ("tiers:\n  - kind: host\n    [a, b]: 1\n", 3, "not a list"),
    ("tiers:\n  - kind: host\n    {a: 1}: 2\n", 3, "not a map"),
    ("tiers:\n  - kind: host\n    ? [a]\n    : 1\n", 3, "not a list"),
    ("tiers:\n  - kind: host\n    1: 2\n", 3, "reads as a number"),
    ("tiers:\n  - kind: host\n    ~: 2\n", 3, "empty (null)"),
    ("yes: 1\n", 1, "reads as a true/false"),
    ("base: &b {1: host}\ntiers:\n  - <<: *b\n", 1, "reads as a number"),
    ("tiers:\n  - <<: 5\n", 2, "for merging"),
    ("tiers:\n  - kind: host\n    capacity: [1, 2]\n", 3, "got `array`"),
    ("tiers:\n  - kind: host\n    capacity: {a: 1}\n", 3, "got `object`"),
    ("tiers:\n  - kind: host\n    capacity: ~\n", 3, "got `null`"),
    ("tiers:\n  - kind: host\n    capacity: true\n", 3, "got `bool`"),
    ("tiers:\n  - kind: host\n    capacity: .inf\n", 3, "got `float`"),
    ("tiers:\n  - kind: host\n    capacity: " + "9" * 400 + "GiB\n", 3, "larger than any machine"),
    ("tiers:\n  - kind: lmdb\n    max_readers: " + "9" * 40 + "\n", 3, "between 1 and 65536"),
    ("tiers:\n  - kind: hbm\n    fraction_of_free: 1e400\n", 3, "out of range"),
    ("tiers:\n  - kind: pool\n    timeout: .nan\n", 3, "must not be negative"),
    ("tiers:\n  - kind: pool\n    timeout: 2001-12-14\n", 3, "got `date`"),
    ("tiers:\n  - kind: host\n    capacity: !!binary aGVsbG8=\n", 3, "got `bytes`"),
    ("tiers:\n  - kind: [host]\n", 2, "got `list`"),
    ("tiers:\n  - capacity: 1\n", 2, "missing required field `kind`"),
    ("policy:\n  pins: {a: 1}\n", 2, "got `object`"),
    ("namespace_tag: \"\\ud800\"\n", 1, "lone surrogate"),
    ("tiers:\n  - kind: host\x01\n", 2, "0x0001 is not allowed"),
    ("tiers: []\n---\ntiers: []\n", 2, "another document"),
    ("tiers: !!python/object:os.system ls\n", 1, "could not determine a constructor"),
    ("tiers:\n  - kind: host\n    capacity: 1\n    capacity: 2\n", 4, "duplicate key 'capacity'"),
    (_LAUGHS, 2, "got `array`"),
    ("tiers: &a [*a]\n", 1, "got `array`"),
], ids=lambda v: repr(v)[:40] if isinstance(v, str) else None)
def test_odd_yaml_is_a_config_error_naming_file_and_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, words: str) -> None:
    f = tmp_path / "odd.yaml"
    f.write_text(text, encoding="utf-8")
    assert cli_main(["config", "check", str(f)]) == 2
    err = capsys.readouterr().err
    assert words in err and str(f) in err, err
    assert f"line {line} " in err or f"line {line})" in err or f"line {line}:" in err, err


@pytest.mark.parametrize("text", ["tiers: " + "[" * 3000 + "]" * 3000 + "\n",
                                  # 999 levels: past the recursion limit, within the 1 MiB bound
                                  "tiers:\n" + "".join("  " * i + "a:\n" for i in range(1, 1000))])
def test_absurdly_deep_nesting_is_a_config_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=r"nested too deeply.*deep.yaml"):
        load_config_file(f)


def test_json_with_a_lone_surrogate_or_deep_nesting_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text('{"namespace_tag": "\\ud800"}')
    with pytest.raises(ConfigError, match="lone surrogate"):
        load_config_file(f)
    f.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config_file(f)


def test_yaml_merge_keys_and_anchors_load(tmp_path: Path) -> None:
    f = tmp_path / "merge.yaml"
    f.write_text("tiers:\n  - &h {kind: host, capacity: 1GiB}\n  - <<: {kind: pool, timeout: 3s}\n"
                 "    connections: 2\n")
    config = load_config_file(f)
    assert config.tiers[0] == HostTierConfig(capacity=1 << 30)
    assert config.tiers[1].timeout == 3.0 and config.tiers[1].connections == 2


def test_a_config_file_over_the_size_bound_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate((1 << 20) + 1)  # sparse: one byte over the 1 MiB docs/configuration.md states
    with pytest.raises(ConfigError, match=rf"cannot read config file: it holds {(1 << 20) + 1} "
                                          rf"bytes, over the limit of {1 << 20} bytes \(in {big}\)"):
        load_config({"config_file": str(big)})


def test_a_directory_named_as_config_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"it is a directory, not a regular file \(in {tmp_path}\)"):
        load_config({"config_file": str(tmp_path)})


@pytest.mark.parametrize("value", [5, None, ["a.yaml"], ""])
def test_a_config_file_key_that_is_no_path_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="expected the path of a config file") as info:
        load_config({"config_file": value})
    assert info.value.key == "config_file"
