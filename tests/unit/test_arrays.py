from __future__ import annotations

import numpy as np
import pytest

from harnessrl import arrays
from harnessrl.errors import InvalidArgument


def test_round_trip_without_python_lists() -> None:
    ids = np.arange(200_000, dtype=np.int32)
    msg = arrays.make_tokens(ids, np.ones(len(ids)), np.full(len(ids), -0.5), np.zeros(len(ids)))
    assert arrays.validate_tokens(msg) == 200_000
    back = arrays.unpack_i32(msg.ids)
    assert back.dtype == np.dtype("<i4") and np.array_equal(back, ids)
    assert float(arrays.unpack_f32(msg.logprobs)[7]) == -0.5


def test_routes_keep_their_shape() -> None:
    routes = np.random.default_rng(0).integers(0, 128, size=(5, 40, 8), dtype=np.uint8)
    msg = arrays.make_tokens([1, 2, 3, 4, 5], [1] * 5, [0.0] * 5, [3] * 5, routed_experts=routes)
    assert np.array_equal(arrays.unpack_routes(msg.routed_experts), routes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask": [1, 1]}, "mask has 2 entries but ids has 3"),
        ({"logprobs": [0.0]}, "logprobs has 1 entries"),
        ({"policy_versions": []}, "policy_versions has 0 entries"),
        ({"routed_experts": np.zeros((2, 1, 1), dtype=np.uint8)}, "routed_experts has 2 tokens"),
        ({"routed_experts": np.zeros((3, 1), dtype=np.uint8)}, "expected 3 dims"),
    ],
)
def test_length_mismatch_is_invalid_argument(kwargs: dict, message: str) -> None:
    base = {"ids": [1, 2, 3], "mask": [1, 1, 1], "logprobs": [0.0] * 3, "policy_versions": [0] * 3}
    with pytest.raises(InvalidArgument, match=message):
        arrays.make_tokens(**{**base, **kwargs})


def test_truncated_bytes_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match="not a whole number of int32"):
        arrays.unpack_i32(b"\x00\x01\x02")
