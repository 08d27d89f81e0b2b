"""Config text in and out: YAML or JSON read into the typed config of ``config``, every error naming
the key, the source and, where the text is at hand, the line; and a config written back as YAML
with its secrets redacted.

It touches the schema and the one file it is handed, nothing else: which file or dict a process's
config comes from is ``config_sources``'s, and the JSON of SGLang's built-in backend is read by
``builtin_config`` (its own rules).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from .config import REDACTED, StoreConfig
from .errors import ConfigError
from .files import read_regular_file

# The most a config file read by path may hold (ours, the pool's, SGLang's built-in JSON): a config
# is a few KiB, so anything larger is the wrong file, and a bound keeps a wrong one from filling
# the reading scheduler's memory. Arbitrary.
MAX_CONFIG_BYTES = 1 << 20

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _not_a_name(key: Any, raw: str) -> str:
    # Every key we read is a field name; YAML 1.1 turns some bare words into other types.
    if isinstance(key, (list, dict, set, tuple)):
        shape = "list" if isinstance(key, (list, tuple)) else "map"
        return f"a key must be a name like `capacity`, not a {shape} (a `[...]`, `{{...}}` or `? ` key)"
    if key is None:
        return "a key is empty (null); keys are names like `capacity`"
    kind = ("true/false" if isinstance(key, bool) else "number" if isinstance(key, (int, float))
        else type(key).__name__)
    return (f"key {raw!r} reads as a {kind}, not a name; keys are names like `capacity` "
            "(quote it if you mean the word)")


@functools.cache
def _strict_loader() -> type:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """Keys must be names and given once per mapping (PyYAML silently keeps the last, and a
        list or map as a key is a TypeError deep inside it); text must be valid Unicode."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            if isinstance(node, yaml.MappingNode):
                for key_node, _ in node.value:
                    if key_node.tag == _MERGE_TAG:  # ``<<: *base``; the merged keys are checked below
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if not isinstance(key, str):
                        raise yaml.constructor.ConstructorError(
                            None, None, _not_a_name(key, getattr(key_node, "value", "")),
                            key_node.start_mark)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (given twice in one mapping)",
                            key_node.start_mark)
                    seen.add(key)
            mapping = super().construct_mapping(node, deep)
            stray = next((k for k in mapping if not isinstance(k, str)), _MERGE_TAG)
            if stray is not _MERGE_TAG:  # a non-name key that came in through a ``<<`` merge
                raise yaml.constructor.ConstructorError(None, None, _not_a_name(stray, str(stray)),
                                                        node.start_mark)
            return mapping

        def construct_text(self, node: Any) -> str:
            value = self.construct_scalar(node)
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "text holds a lone surrogate escape (\\ud800..\\udfff), which is "
                    "not a character", node.start_mark) from None
            return value

    StrictLoader.add_constructor("tag:yaml.org,2002:str", StrictLoader.construct_text)
    return StrictLoader


def _yaml_load(text: str, source: str) -> Any:
    """Plain data from YAML text; every problem is a ``ConfigError`` naming ``source`` and the line."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where, problem = f" line {mark.line + 1} column {mark.column + 1}", e.problem
        elif isinstance(e, yaml.reader.ReaderError):  # a control character: it knows only an offset
            where = f" line {text.count(chr(10), 0, e.position) + 1}"
            problem = (f"character {ord(e.character) if isinstance(e.character, str) else e.character:#06x} "
                      "is not allowed in YAML")
        else:
            where, problem = "", str(e)
        raise ConfigError(f"malformed YAML{where}: {problem}", source=source) from None
    except RecursionError:
        raise ConfigError("nested too deeply to parse (a config is a few levels deep)",
                          source=source) from None


def _line_of_key(text: str, key: str) -> int | None:
    """The 1-based line of the node at ``key`` (``tiers[0].capacity``) in YAML or JSON ``text``,
    or of the deepest part of that path the text has (a missing field: its parent)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    line = None
    for part in re.findall(r"\[(\d+)\]|([^.\[\]]+)", key):
        index, name = part
        if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
        elif name and isinstance(node, yaml.MappingNode):
            hits = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == name]
            if not hits:
                break
            key_node, node = hits[-1]
            line = key_node.start_mark.line + 1
            continue
        else:
            break
        line = node.start_mark.line + 1
    return line


def _key_from_msgspec(message: str) -> tuple[str, str | None]:
    # msgspec says e.g. "Object contains unknown field `foo` - at `$.tiers[0]`".
    m = re.search(r" - at `\$\.?(.*)`$", message)
    path = m.group(1) if m else ""
    body = message[: m.start()] if m else message
    # Name the field itself when the message is about one (unknown key, or a value we rejected).
    field_m = re.search(r"unknown field `([^`]+)`", body) or re.match(r"`([^`]+)`: ", body)
    if field_m:
        path = f"{path}.{field_m.group(1)}" if path else field_m.group(1)
        if body.startswith("`"):
            body = body[field_m.end():]
    if path.endswith(".kind") and body.startswith("Invalid value"):
        body += " (tier kinds: hbm, host, pool, mooncake_store, lmdb)"
    return body, path or None


def _holds_lone_surrogate(data: Any) -> bool:
    # Iterative, and each container once: YAML aliases share containers and may form a cycle.
    todo, seen = [data], set()
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, (dict, list)) and id(item) not in seen:
            seen.add(id(item))
            todo.extend(item.items() if isinstance(item, dict) else item)
        elif isinstance(item, tuple):
            todo.extend(item)
    return False


def parse_config(data: Any, source: str = "<dict>", cls: type = StoreConfig, *,
                 text: str | None = None) -> Any:
    """Build a frozen config from plain data; ``ConfigError`` names the key and the source (and,
    given the ``text`` the data was read from, the line of that key)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    if _holds_lone_surrogate(data):  # JSON and SGLang's dict may carry "\\ud800"; keys would break
        raise ConfigError("text holds a lone surrogate escape (\\ud800..\\udfff), which is not a "
                          "character", source=source)
    try:
        return msgspec.convert(data, cls, strict=False)
    except msgspec.ValidationError as e:
        body, key = _key_from_msgspec(str(e))
        line = _line_of_key(text, key) if text is not None and key else None
        raise ConfigError(body, key=key, source=f"{source} line {line}" if line else source) from None
    except RecursionError:
        raise ConfigError("nested too deeply (a config is a few levels deep)", source=source) from None


def load_config_file(path: str | os.PathLike[str], cls: type = StoreConfig) -> Any:
    data, text, source = read_config_file(path)
    return parse_config(data, source, cls, text=text)


def read_config_file(path: str | os.PathLike[str]) -> tuple[Any, str, str]:
    """(the file's data as plain builtins, its text, its path as errors name it), unvalidated.

    Raises: ``ConfigError`` for a path that names no regular file of at most ``MAX_CONFIG_BYTES``
    (``files.read_regular_file``), a file that is not UTF-8 or does not parse.
    """
    p = Path(path).expanduser()
    raw = read_regular_file(p, limit=MAX_CONFIG_BYTES, what="config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text: byte 0x{e.object[e.start]:02x} on line {line} "
                          "(save the file as UTF-8)", source=str(p)) from None
    if p.suffix == ".json":
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"malformed JSON line {e.lineno} column {e.colno}: {e.msg}",
                              source=str(p)) from None
        except RecursionError:
            raise ConfigError("nested too deeply to parse (a config is a few levels deep)",
                              source=str(p)) from None
    else:
        data = _yaml_load(text, str(p))
    return data, text, str(p)


def redact(data: Any) -> Any:
    """``data`` (plain builtins) with every non-empty ``secret`` value replaced by ``REDACTED``."""
    if isinstance(data, dict):
        return {k: REDACTED if k == "secret" and v else redact(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def dump_config(config: Any) -> str:
    """The effective config as YAML (defaults filled in, secrets redacted)."""
    import yaml

    return yaml.safe_dump(redact(msgspec.to_builtins(config)), sort_keys=False)
