"""The contract types of ``mooncake_sgl.api`` on their own."""

from __future__ import annotations

import dataclasses

import pytest

from mooncake_sgl.api import PutResult


def test_a_put_result_is_frozen_and_its_fields_agree_in_length() -> None:
    res = PutResult((True, False), (True, False))
    assert res.ok == (True, False) and res.present == (True, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.ok = (False, False)  # type: ignore[misc]
    with pytest.raises(ValueError, match="2 ok answers but 1 present"):
        PutResult((True, True), (False,))


def test_a_put_result_is_built_for_a_failed_call_and_for_a_tier_that_does_not_say() -> None:
    assert PutResult.missed(3) == PutResult((False,) * 3, (False,) * 3)
    assert PutResult.missed(0) == PutResult((), ())
    written = PutResult.written([True, False, True])
    assert written.ok == (True, False, True) and written.present == (False,) * 3
