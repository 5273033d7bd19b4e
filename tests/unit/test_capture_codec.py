"""The part codec: lossless round trips, compactness, corruption detected."""

from __future__ import annotations

import numpy as np
import pytest

from harnessrl.config import validate as validate_settings
from harnessrl.errors import ConfigError
from services.capture_store import codec
from services.capture_store.settings import Settings


def part(n: int = 1000, sampled: float = 0.3, seed: int = 0, routes: bool = False, prompt: bool = True) -> codec.Part:
    rng = np.random.default_rng(seed)
    mask = (rng.random(n) < sampled).astype(np.uint8)
    lp = np.where(mask == 1, -rng.exponential(1.0, n), 0.0).astype(np.float32)
    r = None
    if routes:
        r = rng.integers(0, 128, (n, 4, 8), dtype=np.uint8)
        r[mask == 0] = 0
    return codec.Part(
        ids=rng.integers(0, 150_000, n).astype(np.int32),
        mask=mask,
        logprobs=lp,
        versions=np.where(mask == 1, 3, -1).astype(np.int32),
        routes=r,
        prompt=rng.integers(0, 150_000, 500).astype(np.int32) if prompt else None,
    )


def assert_same(a: codec.Part, b: codec.Part) -> None:
    for name in ("ids", "mask", "logprobs", "versions"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("routes", "prompt"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("kw", [{}, {"routes": True}, {"prompt": False}, {"n": 0}, {"sampled": 1.0}, {"sampled": 0.0}])
def test_round_trip_is_exact(kw: dict) -> None:
    p = part(**kw)
    assert_same(codec.decode(codec.encode(p)), p)


def test_nonstandard_mask0_values_stay_exact() -> None:
    p = part()
    p.logprobs[p.mask == 0] = -0.0  # not the canonical +0.0 bits
    p.versions[np.flatnonzero(p.mask == 0)[:3]] = 9
    p.routes = np.ones((p.n, 2, 2), np.uint8)
    assert_same(codec.decode(codec.encode(p)), p)


def test_float16_is_close_and_smaller() -> None:
    p = part()
    full, half = codec.encode(p), codec.encode(p, float16=True)
    assert len(half) < len(full)
    got = codec.decode(half)
    assert got.logprobs.dtype == np.float32
    np.testing.assert_allclose(got.logprobs, p.logprobs, rtol=1e-3, atol=1e-4)


def test_compact_without_python_lists() -> None:
    p = part(n=20_000, prompt=False)
    blob = codec.encode(p)
    assert len(blob) / p.n < 6  # ids + mask + logprobs + versions
    decoded = codec.decode(blob)
    assert isinstance(decoded.ids, np.ndarray) and decoded.ids.dtype == np.int32


@pytest.mark.parametrize("damage", ["truncate", "magic", "body", "flip"])
def test_corruption_is_detected(damage: str) -> None:
    blob = bytearray(codec.encode(part()))
    if damage == "truncate":
        blob = blob[:10]
    elif damage == "magic":
        blob[:4] = b"XXXX"
    elif damage == "body":
        blob[-5:] = b"\x00" * 5
    else:
        blob[len(blob) // 2] ^= 0x40
    with pytest.raises(codec.CorruptBlob):
        codec.decode(bytes(blob))


def test_settings_name_what_the_distributed_backend_lacks() -> None:
    with pytest.raises(ConfigError) as info:
        validate_settings(
            Settings, {"backend": "distributed", "redis_url": "redis://x"}, "capture.toml: [capture_store]"
        )
    assert "s3_endpoint" in str(info.value) and "s3_bucket" in str(info.value) and "capture.toml" in str(info.value)
    with pytest.raises(ConfigError) as info:
        validate_settings(Settings, {"retry": {"total_s": -1}}, "[capture_store]")
    assert "retry.total_s" in str(info.value)
