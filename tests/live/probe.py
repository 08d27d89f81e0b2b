"""Greedy generation with logprobs against a live server, and the comparison the live tests make."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Output:
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached_tokens: int
    storage_tokens: int
    storage_backend: str

    def same_as(self, other: Output) -> bool:
        """Identical greedy ids and bit-identical logprobs."""
        return self.output_ids == other.output_ids and self.logprobs == other.logprobs


def prompt(n: int, seed: int, vocab: int = 32000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(n)]


class LiveClient:
    def __init__(self, url: str):
        self.url = url

    def _post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 300.0) -> bytes:
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()

    def generate(self, input_ids: list[int], new_tokens: int = 8) -> Output:
        body = {"input_ids": input_ids, "return_logprob": True,
                "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
        out = json.loads(self._post("/generate", body))
        meta = out["meta_info"]
        details = meta.get("cached_tokens_details") or {}
        return Output(tuple(out["output_ids"]), tuple(lp[0] for lp in meta["output_token_logprobs"]),
                      int(meta.get("cached_tokens") or 0), int(details.get("storage", 0)),
                      str(details.get("storage_backend", "")))

    def update_weights_from_disk(self, model_path: str) -> dict[str, Any]:
        """SGLang's in-place weight update (it flushes the caches the old weights filled): its reply."""
        return json.loads(self._post("/update_weights_from_disk", {"model_path": model_path}))

    def flush(self, wait: float = 60.0) -> None:
        """Drop SGLang's device and host caches: what is reused afterwards comes from storage.

        SGLang refuses a flush (400) while the scheduler is not idle, which includes the moment a
        finished request's backup to storage is still being handed over; its ``timeout`` makes it
        wait for idle instead, up to ``wait`` seconds."""
        try:
            body = self._post(f"/flush_cache?timeout={wait:g}", timeout=wait + 30.0)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"/flush_cache refused after waiting {wait:g} s: "
                                 f"{e.read()[:200]!r}") from None
        if b"Cache flushed" not in body:
            raise AssertionError(f"/flush_cache refused: {body[:200]!r}")


def reusable(prompt_len: int, page: int = 64) -> int:
    """Prompt tokens SGLang can take from a cache: whole pages, never the last token."""
    return (prompt_len - 1) // page * page


def storage_hit(client: LiveClient, input_ids: list[int], attempts: int = 20) -> Output:
    """Flush SGLang's caches and send ``input_ids`` until the whole reusable prefix comes from storage.

    Backups to storage run after a request finishes; a flush can overtake one, and then the request
    is partly recomputed (and backed up again). Each attempt's output is returned for comparison by
    the caller only once the hit is complete.
    """
    want = reusable(len(input_ids))
    last = None
    for _ in range(attempts):
        client.flush()
        last = client.generate(input_ids)
        if last.storage_tokens >= want:
            return last
        time.sleep(0.5)
    raise AssertionError(f"no full storage hit after {attempts} attempts: last {last}")
