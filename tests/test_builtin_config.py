"""SGLang's built-in Mooncake configuration (extra-config keys, its JSON file, MOONCAKE_* variables)
read in the built-in's order and translated into our tiers: each key, each form, the precedence,
and errors that name the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mooncake_sgl import builtin_config as bc
from mooncake_sgl.cli import main as cli_main
from mooncake_sgl.config import (
    HostTierConfig,
    LmdbTierConfig,
    MooncakeStoreTierConfig,
    StoreConfig,
)
from mooncake_sgl.config_sources import resolve_config
from mooncake_sgl.errors import ConfigError

GiB, MiB = 1 << 30, 1 << 20
MASTER = "10.0.0.5:50051"


def resolve(extra: dict[str, Any] | None = None, env: dict[str, str] | None = None,
            ranks: bc.Ranks | None = None):
    return resolve_config(extra, ranks, environ=env or {})


def store_tier(config: StoreConfig) -> MooncakeStoreTierConfig:
    tiers = [t for t in config.tiers if isinstance(t, MooncakeStoreTierConfig)]
    assert len(tiers) == 1, config.tiers
    return tiers[0]


def write_json(tmp_path: Path, data: Any, name: str = "mooncake.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# ----------------------------------------------------------------------------- each key

def test_only_a_master_gives_the_builtins_defaults_over_our_host_tier() -> None:
    r = resolve({"master_server_address": MASTER})
    assert [type(t) for t in r.config.tiers] == [HostTierConfig, MooncakeStoreTierConfig]
    assert r.config.tiers[0] == HostTierConfig()  # the host tier of our embedded default
    assert store_tier(r.config) == MooncakeStoreTierConfig(
        master=MASTER, metadata_server="P2PHANDSHAKE", protocol="rdma", device="",
        local_hostname="localhost", segment_size=4 * GiB, tenant_id="default")
    assert r.config.namespace_tag == "" and r.notes == () and r.check_server_url is None
    assert r.source == "SGLang's built-in Mooncake config in --hicache-storage-backend-extra-config"


def test_every_connection_key_reaches_the_mooncake_store_tier() -> None:
    t = store_tier(resolve({"master_server_address": MASTER, "metadata_server": "http://m:8080/metadata",
                            "protocol": "tcp", "device_name": "mlx5_0,mlx5_1", "local_hostname": "10.0.0.9",
                            "global_segment_size": 3 * GiB, "tenant_id": "tenant-a"}).config)
    assert (t.master, t.metadata_server, t.protocol, t.device, t.local_hostname, t.segment_size,
            t.tenant_id) == (MASTER, "http://m:8080/metadata", "tcp", "mlx5_0,mlx5_1", "10.0.0.9",
                             3 * GiB, "tenant-a")


@pytest.mark.parametrize("value,expected", [
    (4294967296, 4 * GiB), ("4294967296", 4 * GiB), ("4gb", 4 * GiB), (" 2GB ", 2 * GiB),
    ("512MiB", 512 * MiB), (0, 0), ("0", 0),
])
def test_global_segment_size_in_the_builtins_forms(value: Any, expected: int) -> None:
    # "4gb" is 4 GiB to SGLang (int(n) * 1024**3), not our 4 * 10**9.
    cfg = resolve({"master_server_address": MASTER, "global_segment_size": value}).config
    assert store_tier(cfg).segment_size == expected


@pytest.mark.parametrize("value", ["4.5gb", "lots", "4 tb", True, [1], -1, "512mb"])
def test_a_bad_global_segment_size_names_the_key(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        resolve({"master_server_address": MASTER, "global_segment_size": value})
    assert info.value.key == "global_segment_size"


def test_the_segment_is_split_over_tp_times_pp_ranks_as_the_builtin_splits_it() -> None:
    extra = {"master_server_address": MASTER, "global_segment_size": "8gb"}
    assert store_tier(resolve(extra, ranks=bc.Ranks(tp_size=4, pp_size=2)).config).segment_size == 1 * GiB
    with pytest.raises(ConfigError, match="below Mooncake's smallest segment") as info:
        resolve({**extra, "global_segment_size": 64 * MiB}, ranks=bc.Ranks(tp_size=8))
    assert info.value.key == "global_segment_size"


def test_device_name_by_tp_rank_picks_this_ranks_nics() -> None:
    extra = {"master_server_address": MASTER, "device_name": '{"0": "ib0,ib1", "1": "ib2,ib3"}'}
    assert store_tier(resolve(extra, ranks=bc.Ranks(tp_size=2, tp_rank=1)).config).device == "ib2,ib3"
    r = resolve(extra, ranks=bc.Ranks(tp_size=4, tp_rank=3))
    assert store_tier(r.config).device == "" and "no entry for TP rank 3" in r.notes[0]
    with pytest.raises(ConfigError) as info:  # SGLang's README spells it with int keys: not JSON
        resolve({**extra, "device_name": '{0: "ib0,ib1"}'})
    assert info.value.key == "device_name"


@pytest.mark.parametrize(("device", "words"), [
    ('{"0": null}', "entry '0' is a JSON null"),
    ('{"0": ["mlx5_0", "mlx5_1"]}', "entry '0' is a JSON array"),
    ('{"0": 3}', "entry '0' is a JSON number"),
    ('{"0": "mlx5_0", "1": {"nic": "mlx5_1"}}', "entry '1' is a JSON object"),  # another rank's
])
def test_a_device_name_entry_that_is_not_a_string_is_an_error_naming_its_type(device: str,
                                                                              words: str) -> None:
    # It was turned into text: NIC 'None' (logged as auto-discovered), NIC "['mlx5_0', 'mlx5_1']".
    with pytest.raises(ConfigError, match=words) as info:
        resolve({"master_server_address": MASTER, "device_name": device})
    assert info.value.key == "device_name"
    with pytest.raises(ConfigError, match=words) as info:
        resolve(env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": device})
    assert info.value.key == "MOONCAKE_DEVICE"


@pytest.mark.parametrize("value,expected", [(None, "default"), ("", "default"), ("  ", "default"),
                                            (" t1 ", "t1"), (7, "7")])
def test_tenant_id_is_normalised_as_sglang_does(value: Any, expected: str) -> None:
    cfg = resolve({"master_server_address": MASTER, "tenant_id": value}).config
    assert store_tier(cfg).tenant_id == expected


def test_extra_backend_tag_becomes_our_namespace_tag() -> None:
    cfg = resolve({"master_server_address": MASTER, "extra_backend_tag": "team-a"}).config
    assert cfg.namespace_tag == "team-a"
    with pytest.raises(ConfigError, match="not both") as info:
        resolve({"master_server_address": MASTER, "extra_backend_tag": "a", "namespace_tag": "b"})
    assert info.value.key == "namespace_tag"


def test_ssd_offload_becomes_our_lmdb_tier_under_the_mooncake_store() -> None:
    cfg = resolve({"master_server_address": MASTER, "enable_ssd_offload": True,
                   "ssd_offload_path": "/mnt/ssd"}).config
    assert [type(t) for t in cfg.tiers] == [HostTierConfig, MooncakeStoreTierConfig, LmdbTierConfig]
    assert cfg.tiers[2] == LmdbTierConfig(path="/mnt/ssd")
    cfg = resolve({"master_server_address": MASTER, "enable_ssd_offload": True}).config
    assert cfg.tiers[2] == LmdbTierConfig()  # our default path, under the cache directory
    r = resolve({"master_server_address": MASTER, "ssd_offload_path": "/mnt/ssd"})
    assert len(r.config.tiers) == 2 and "ssd_offload_path '/mnt/ssd' not used" in r.notes[0]


def test_check_server_waits_on_the_masters_metrics_port() -> None:
    r = resolve({"master_server_address": MASTER, "check_server": True, "master_metrics_port": 9100})
    assert r.check_server_url == "http://10.0.0.5:9100/get_all_segments"
    r = resolve({"master_server_address": MASTER, "check_server": True})
    assert r.check_server_url == "http://10.0.0.5:9003/get_all_segments"
    r = resolve({"master_server_address": MASTER, "master_metrics_port": 9100})
    assert r.check_server_url is None and "only check_server reads it" in r.notes[0]
    with pytest.raises(ConfigError, match="HA address") as info:
        resolve({"master_server_address": "etcd://h1:2379", "check_server": True})
    assert info.value.key == "check_server"


def test_group_semantics_and_local_buffer_size_say_what_they_change() -> None:
    r = resolve({"master_server_address": MASTER, "enable_group_semantics": True, "local_buffer_size": 0})
    assert any(n.startswith("enable_group_semantics: already so within a rank") for n in r.notes)
    assert any(n.startswith("local_buffer_size not used") for n in r.notes)
    assert len(r.config.tiers) == 2


@pytest.mark.parametrize("extra,key,words", [
    ({"master_server_address": MASTER, "standalone_storage": True,
      "client_server_address": "127.0.0.1:50052"}, "standalone_storage", "not supported"),
    ({"client_server_address": "127.0.0.1:50052"}, "client_server_address", "give master_server_address"),
    ({"master_server_address": MASTER, "protocol": "efa"}, "protocol", "tcp and rdma"),
    ({"master_server_address": ""}, "master_server_address", "empty"),
    ({"master_server_address": MASTER, "check_server": "false"}, "check_server", "true or false"),
    ({"master_server_address": MASTER, "master_metrics_port": 0}, "master_metrics_port", "port"),
    ({"master_server_address": 50051}, "master_server_address", "string"),
    # Ours and the built-in's tiers at once: which would win is not guessable.
    ({"master_server_address": MASTER, "tiers": [{"kind": "host"}]}, "tiers", "not both"),
    ({"master_server_address": MASTER, "config_file": "x.yaml"}, "config_file", "not both"),
    ({"master_server_address": MASTER, "colour": "red"}, "colour", "unknown key"),
    # The built-in reads its extra-config keys only beside a master and would ignore this silently.
    ({"metadata_server": "P2PHANDSHAKE"}, "metadata_server", "add master_server_address"),
    ({"extra_backend_tag": "a"}, "extra_backend_tag", "none was given"),
])
def test_what_has_no_equivalent_is_an_error_naming_the_key(extra: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(extra)
    assert info.value.key == key and words in str(info.value), str(info.value)
    assert "extra-config" in str(info.value)


def test_our_policy_may_stand_beside_the_builtins_keys() -> None:
    cfg = resolve({"master_server_address": MASTER, "policy": {"name": "lru"}}).config
    assert cfg.policy.name == "lru" and len(cfg.tiers) == 2


def test_sglangs_own_keys_beside_the_builtins_are_left_to_sglang() -> None:
    cfg = resolve({"master_server_address": MASTER, "tp_lcm_size": 4, "interface_v1": 1,
                   "prefetch_threshold": 256}).config
    assert store_tier(cfg).master == MASTER


# ----------------------------------------------------------------------------- the forms

def test_the_json_file_form(tmp_path: Path) -> None:
    path = write_json(tmp_path, {"master_server_address": MASTER, "protocol": "tcp",
                                 "global_segment_size": "2gb", "metadata_server": "http://m:8080/metadata",
                                 "enable_ssd_offload": True,
                                 "ssd_offload_path": str(tmp_path / "ssd"), "tenant_id": "t"})
    r = resolve(env={bc.FILE_ENV: path})
    t = store_tier(r.config)
    assert (t.master, t.protocol, t.segment_size, t.metadata_server, t.tenant_id) == (
        MASTER, "tcp", 2 * GiB, "http://m:8080/metadata", "t")
    assert r.config.tiers[2].path == str(tmp_path / "ssd")
    assert r.source == f"SGLang's built-in Mooncake config in {path}"


@pytest.mark.parametrize("data,key,words", [
    ({"master_server_address": MASTER, "master_addr": "x"}, "master_addr", "unknown key"),
    ({"protocol": "tcp"}, "master_server_address", "is required"),
    ({"master_server_address": MASTER, "enable_ssd_offload": "yes"}, "enable_ssd_offload", "true or false"),
])
def test_a_bad_json_file_names_the_key_and_the_file(tmp_path: Path, data: dict, key: str, words: str) -> None:
    path = write_json(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        resolve(env={bc.FILE_ENV: path})
    assert info.value.key == key and words in str(info.value) and path in str(info.value)


def test_an_unreadable_json_file_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"master_server_address": ')
    with pytest.raises(ConfigError, match="malformed JSON line 1"):
        resolve(env={bc.FILE_ENV: str(bad)})
    with pytest.raises(ConfigError, match=f"cannot read.*{bc.FILE_ENV}"):
        resolve(env={bc.FILE_ENV: str(tmp_path / "missing.json")})
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        resolve(env={bc.FILE_ENV: str(tmp_path / "list.json")})


def test_the_env_form_reads_every_variable() -> None:
    env = {"MOONCAKE_MASTER": MASTER, "MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_DEVICE": "erdma_0",
           "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb", "MOONCAKE_LOCAL_HOSTNAME": "10.0.0.9",
           "MOONCAKE_TE_META_DATA_SERVER": "http://m:8080/metadata", "MOONCAKE_TENANT_ID": "t",
           "MOONCAKE_ENABLE_SSD_OFFLOAD": "1", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "/mnt/ssd",
           "MOONCAKE_CHECK_SERVER": "yes", "MOONCAKE_MASTER_METRICS_PORT": "9100"}
    r = resolve(env=env)
    t = store_tier(r.config)
    assert (t.master, t.protocol, t.device, t.segment_size, t.local_hostname, t.metadata_server,
            t.tenant_id) == (MASTER, "tcp", "erdma_0", GiB, "10.0.0.9", "http://m:8080/metadata", "t")
    assert r.config.tiers[2] == LmdbTierConfig(path="/mnt/ssd")
    assert r.check_server_url == "http://10.0.0.5:9100/get_all_segments"
    assert r.source == "SGLang's built-in Mooncake config in the MOONCAKE_* environment"


def test_a_tilde_in_the_builtins_offload_path_is_the_home_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {"MOONCAKE_MASTER": MASTER, "MOONCAKE_ENABLE_SSD_OFFLOAD": "1",
           "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "~/ssd"}
    assert resolve(env=env).config.tiers[2] == LmdbTierConfig(path=str(tmp_path / "ssd"))


def test_the_env_form_takes_the_builtins_defaults() -> None:
    t = store_tier(resolve(env={"MOONCAKE_MASTER": MASTER}).config)
    assert (t.protocol, t.metadata_server, t.segment_size, t.local_hostname) == (
        "rdma", "P2PHANDSHAKE", 4 * GiB, "localhost")


@pytest.mark.parametrize("var,value", [("MOONCAKE_CHECK_SERVER", "maybe"),
                                       ("MOONCAKE_MASTER_METRICS_PORT", "http"),
                                       ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4 gigs"),
                                       ("MOONCAKE_STANDALONE_STORAGE", "1")])
def test_a_bad_variable_is_named(var: str, value: str) -> None:
    # SGLang would warn and take the default for a value it cannot parse; we refuse it.
    with pytest.raises(ConfigError) as info:
        resolve(env={"MOONCAKE_MASTER": MASTER, var: value})
    assert info.value.key == var


def test_extra_config_only_keys_apply_to_the_file_and_env_forms(tmp_path: Path) -> None:
    # The built-in reads extra_backend_tag and enable_group_semantics from extra-config whatever
    # form gave the rest.
    extra = {"extra_backend_tag": "team-a", "enable_group_semantics": True}
    r = resolve(extra, env={"MOONCAKE_MASTER": MASTER})
    assert r.config.namespace_tag == "team-a" and any("enable_group_semantics" in n for n in r.notes)
    path = write_json(tmp_path, {"master_server_address": MASTER})
    assert resolve(extra, env={bc.FILE_ENV: path}).config.namespace_tag == "team-a"


# ----------------------------------------------------------------------------- precedence

def test_extra_config_comes_before_the_file_which_comes_before_the_env(tmp_path: Path) -> None:
    path = write_json(tmp_path, {"master_server_address": "file:1"})
    env = {bc.FILE_ENV: path, "MOONCAKE_MASTER": "env:1"}
    r = resolve({"master_server_address": "extra:1"}, env=env)
    assert store_tier(r.config).master == "extra:1"
    assert any(f"${bc.FILE_ENV} is set but not read" in n for n in r.notes)
    assert any("$MOONCAKE_MASTER not read" in n for n in r.notes)
    r = resolve(None, env=env)
    assert store_tier(r.config).master == "file:1"
    assert any("$MOONCAKE_MASTER not read" in n for n in r.notes)
    assert store_tier(resolve(None, env={"MOONCAKE_MASTER": "env:1"}).config).master == "env:1"


def test_a_null_master_in_extra_config_leaves_the_file_or_env_form(tmp_path: Path) -> None:
    # As the built-in decides: ``extra_config.get("master_server_address") is not None``.
    r = resolve({"master_server_address": None}, env={"MOONCAKE_MASTER": "env:1"})
    assert store_tier(r.config).master == "env:1"


def test_within_the_builtin_forms_missing_keys_take_defaults_not_variables() -> None:
    # SGLang's quirks, kept: protocol falls back to $MOONCAKE_PROTOCOL, local_hostname is overridden
    # by $MOONCAKE_LOCAL_HOSTNAME (per node); every other variable is not read in this form.
    env = {"MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_LOCAL_HOSTNAME": "10.0.0.9",
           "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1gb"}
    r = resolve({"master_server_address": MASTER, "local_hostname": "10.0.0.1"}, env=env)
    t = store_tier(r.config)
    assert (t.protocol, t.local_hostname, t.segment_size) == ("tcp", "10.0.0.9", 4 * GiB)
    assert any("overridden by $MOONCAKE_LOCAL_HOSTNAME" in n for n in r.notes)
    assert any("$MOONCAKE_GLOBAL_SEGMENT_SIZE not read" in n for n in r.notes)
    given = resolve({"master_server_address": MASTER, "protocol": "rdma"}, env=env).config
    assert store_tier(given).protocol == "rdma"
    t = store_tier(resolve({"master_server_address": MASTER}, env={"LOCAL_HOSTNAME": "10.0.0.7"}).config)
    assert t.local_hostname == "10.0.0.7"


def test_our_config_comes_before_the_builtins(tmp_path: Path) -> None:
    ours = tmp_path / "tiers.yaml"
    ours.write_text("tiers:\n  - kind: host\n    capacity: 1GiB\n")
    builtin = write_json(tmp_path, {"master_server_address": MASTER})
    env = {"MOONCAKE_SGL_CONFIG": str(ours), bc.FILE_ENV: builtin, "MOONCAKE_MASTER": MASTER}
    r = resolve(None, env=env)
    assert r.config.tiers == [HostTierConfig(capacity=GiB)]
    assert [n.split()[0] for n in r.notes] == [f"${bc.FILE_ENV}", "$MOONCAKE_MASTER"]
    r = resolve({"tiers": [{"kind": "host", "capacity": "2GiB"}]}, env=env)
    assert r.config.tiers == [HostTierConfig(capacity=2 * GiB)] and len(r.notes) == 3
    with pytest.raises(ConfigError, match="names ours") as info:
        resolve({"extra_backend_tag": "a"}, env=env)
    assert info.value.key == "extra_backend_tag"


def test_stray_variables_beside_the_embedded_default_are_said_not_read() -> None:
    r = resolve(None, env={"MOONCAKE_PROTOCOL": "tcp"})
    assert r.config == StoreConfig() and r.source == "the embedded default"
    assert "$MOONCAKE_PROTOCOL set but not read" in r.notes[0]
    assert resolve(None, env={}).notes == ()


def test_the_attach_line_says_the_form_and_the_tiers() -> None:
    line = resolve({"master_server_address": MASTER, "protocol": "tcp", "global_segment_size": "1gb",
                    "enable_ssd_offload": True, "ssd_offload_path": "/mnt/ssd"}).describe()
    assert line == ("config from SGLang's built-in Mooncake config in --hicache-storage-backend-extra-config"
                    " -> tiers host 4GiB, mooncake_store (master 10.0.0.5:50051, metadata P2PHANDSHAKE, tcp, "
                    "host localhost, segment 1GiB), lmdb 64GiB at /mnt/ssd; policy adaptive")


# ----------------------------------------------------------------------------- the CLI

def test_config_show_translates_a_builtin_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path, {"master_server_address": MASTER, "protocol": "tcp",
                                 "global_segment_size": "4gb", "enable_ssd_offload": True})
    assert cli_main(["config", "show", path, "--tp-size", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# config from SGLang's built-in Mooncake config in {path}\n")
    assert "kind: mooncake_store" in out and f"master: {MASTER}" in out and "kind: lmdb" in out
    assert f"segment_size: {2 * GiB}" in out  # 4 GiB over two TP ranks
    assert cli_main(["config", "check", path]) == 0
    assert "ok:" in capsys.readouterr().out


def test_config_show_of_this_environment_and_of_an_extra_config(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("MOONCAKE_SGL_CONFIG", bc.FILE_ENV, *bc.BUILTIN_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", MASTER)
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    assert cli_main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "the MOONCAKE_* environment" in out.splitlines()[0] and "protocol: tcp" in out
    assert cli_main(["config", "show", "--extra-config", json.dumps({"master_server_address": "x:1",
                                                                     "check_server": True})]) == 0
    out = capsys.readouterr().out
    assert "master: x:1" in out and "# check_server: attach waits" in out
    both = '{"master_server_address": "x:1", "tiers": []}'
    assert cli_main(["config", "show", "--extra-config", both]) == 2
    assert "at 'tiers'" in capsys.readouterr().err


def test_config_check_of_a_bad_builtin_json_names_the_key(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path, {"master_server_address": MASTER, "standalone_storage": True})
    assert cli_main(["config", "check", path]) == 2
    assert "at 'standalone_storage'" in capsys.readouterr().err


def test_config_show_names_a_typo_in_a_builtin_json(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path, {"master_server_address": MASTER, "protocl": "tcp"})
    assert cli_main(["config", "show", path]) == 2
    assert "unknown key 'protocl'" in capsys.readouterr().err


def test_a_builtin_json_given_as_our_config_says_where_it_goes(tmp_path: Path) -> None:
    path = write_json(tmp_path, {"master_server_address": MASTER})
    with pytest.raises(ConfigError, match=f"name that JSON file by \\${bc.FILE_ENV}") as info:
        resolve(env={"MOONCAKE_SGL_CONFIG": path})
    assert info.value.key == "master_server_address"


def test_a_builtin_json_path_that_is_no_small_regular_file_is_refused_naming_it(tmp_path: Path) -> None:
    big = tmp_path / "mooncake.json"
    with open(big, "wb") as f:
        f.truncate((1 << 20) + 1)  # sparse
    with pytest.raises(ConfigError, match=rf"cannot read SGLang's Mooncake config file \(named by "
                                          rf"\${bc.FILE_ENV}\): it holds .*over the limit of "
                                          rf"{1 << 20} bytes \(in {big}\)"):
        resolve(env={bc.FILE_ENV: str(big)})
    with pytest.raises(ConfigError, match=rf"it is a directory, not a regular file \(in {tmp_path}\)"):
        resolve(env={bc.FILE_ENV: str(tmp_path)})
