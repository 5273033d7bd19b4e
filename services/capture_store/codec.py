"""Compact, lossless on-disk encoding of one part (one model call's tokens).

Why this shape: a JSON line per token costs ~60-100 bytes; here a token costs
about 2-6 bytes. Each array is byte-shuffled (all low bytes, then the next
bytes, ...) so the constant high bytes of token ids and logprob exponents form
long runs zstd removes. Logprobs, policy versions and routes are stored only
for sampled tokens (mask 1) when the mask-0 entries hold their documented
neutral values (0.0, -1, zero rows); otherwise the dense array is kept, so
decoding always returns exactly what was appended (float16 logprobs excepted,
which is opt-in and lossy).

Layout: a fixed uncompressed header (``_HEADER``), then one zstd frame holding
the sections in order: prompt ids, ids, mask bits, logprobs, policy versions,
routes.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import zstandard

from harnessrl.errors import HarnessError

_MAGIC = b"HRC1"
_HEADER = struct.Struct("<4sBBIIIHH")  # magic, version, flags, n_prompt, n, n_sampled, layers, top_k
_VERSION = 1

F_PROMPT = 1
F_LP16 = 2
F_LP_DENSE = 4
F_PV_DENSE = 8
F_ROUTES = 16
F_ROUTES_DENSE = 32

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")
F16 = np.dtype("<f2")
U8 = np.dtype("u1")


class CorruptBlob(HarnessError):
    """A stored blob does not decode: storage corruption, never a client error."""


@dataclass
class Part:
    """Dense arrays of one part; every array has ``n`` rows (``prompt`` aside)."""

    ids: npt.NDArray[np.int32]
    mask: npt.NDArray[np.uint8]
    logprobs: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int32]
    routes: npt.NDArray[np.uint8] | None = None
    prompt: npt.NDArray[np.int32] | None = None

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] = _local.__dict__.setdefault("c", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True)  # bit rot is detected
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "d"):
        _local.d = zstandard.ZstdDecompressor()
    return _local.d  # type: ignore[no-any-return]


def _shuffle(arr: npt.NDArray[np.generic]) -> bytes:
    width = arr.dtype.itemsize
    if width == 1 or arr.size == 0:
        return arr.tobytes()
    return np.ascontiguousarray(arr).view(U8).reshape(-1, width).T.tobytes()


def _unshuffle(buf: memoryview, dtype: np.dtype, count: int) -> npt.NDArray[np.generic]:
    width = dtype.itemsize
    raw = np.frombuffer(buf, dtype=U8, count=count * width)
    if width == 1 or count == 0:
        return raw.view(dtype)
    return np.ascontiguousarray(raw.reshape(width, count).T).view(dtype).reshape(count)


def encode(part: Part, *, float16: bool = False, level: int = 3) -> bytes:
    """Encodes ``part``; the mask must hold only 0 and 1 (checked by the caller)."""
    sampled = part.mask.astype(bool)
    n_sampled = int(sampled.sum())
    flags = F_PROMPT if part.prompt is not None else 0
    sections: list[bytes] = []
    if part.prompt is not None:
        sections.append(_shuffle(part.prompt.astype(I32, copy=False)))
    sections.append(_shuffle(part.ids.astype(I32, copy=False)))
    sections.append(np.packbits(sampled).tobytes())

    lp = part.logprobs.astype(F32, copy=False)
    if np.any(lp[~sampled].view(np.uint32)):  # exact 0.0 bits, so -0.0 and NaN stay dense
        flags |= F_LP_DENSE
    else:
        lp = lp[sampled]
    if float16:
        flags |= F_LP16
        lp = lp.astype(F16)
    sections.append(_shuffle(lp))

    pv = part.versions.astype(I32, copy=False)
    if np.any(pv[~sampled] != -1):
        flags |= F_PV_DENSE
    else:
        pv = pv[sampled]
    sections.append(_shuffle(pv))

    layers = top_k = 0
    if part.routes is not None:
        flags |= F_ROUTES
        _, layers, top_k = part.routes.shape
        routes = part.routes
        if np.any(routes[~sampled]):
            flags |= F_ROUTES_DENSE
        else:
            routes = routes[sampled]
        sections.append(np.ascontiguousarray(routes, dtype=U8).tobytes())

    n_prompt = 0 if part.prompt is None else int(part.prompt.shape[0])
    header = _HEADER.pack(_MAGIC, _VERSION, flags, n_prompt, part.n, n_sampled, layers, top_k)
    return header + _compressor(level).compress(b"".join(sections))


def decode(blob: bytes | memoryview) -> Part:
    """Decodes a blob written by :func:`encode` into dense numpy arrays."""
    try:
        magic, version, flags, n_prompt, n, n_sampled, layers, top_k = _HEADER.unpack_from(blob)
    except struct.error as e:
        raise CorruptBlob(f"part blob too short ({len(blob)} bytes)") from e
    if magic != _MAGIC or version != _VERSION:
        raise CorruptBlob(f"part blob has magic {magic!r} version {version}, expected {_MAGIC!r} {_VERSION}")
    try:
        body = memoryview(_decompressor().decompress(bytes(blob[_HEADER.size :])))
    except zstandard.ZstdError as e:
        raise CorruptBlob(f"part blob does not decompress: {e}") from e
    reader = _Reader(body)
    prompt = reader.array(I32, n_prompt) if flags & F_PROMPT else None
    ids = reader.array(I32, n)
    sampled = np.unpackbits(reader.array(U8, (n + 7) // 8).view(np.uint8), count=n).astype(bool)
    if n_sampled != int(sampled.sum()):
        raise CorruptBlob(f"part blob mask has {int(sampled.sum())} sampled tokens, header says {n_sampled}")
    lp_count = n if flags & F_LP_DENSE else n_sampled
    lp = reader.array(F16 if flags & F_LP16 else F32, lp_count).astype(F32, copy=False)
    pv = reader.array(I32, n if flags & F_PV_DENSE else n_sampled)
    routes = None
    if flags & F_ROUTES:
        rows = n if flags & F_ROUTES_DENSE else n_sampled
        flat = reader.array(U8, rows * layers * top_k).reshape(rows, layers, top_k)
        routes = flat if flags & F_ROUTES_DENSE else _scatter(flat, sampled, np.zeros((n, layers, top_k), U8))
    reader.done()
    return Part(
        ids=ids,  # type: ignore[arg-type]
        mask=sampled.astype(U8),
        logprobs=lp if flags & F_LP_DENSE else _scatter(lp, sampled, np.zeros(n, F32)),  # type: ignore[arg-type]
        versions=pv if flags & F_PV_DENSE else _scatter(pv, sampled, np.full(n, -1, I32)),  # type: ignore[arg-type]
        routes=routes,  # type: ignore[arg-type]
        prompt=prompt,  # type: ignore[arg-type]
    )


def _scatter(values: npt.NDArray[Any], where: npt.NDArray[np.bool_], out: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out[where] = values
    return out


class _Reader:
    def __init__(self, body: memoryview) -> None:
        self._body = body
        self._pos = 0

    def array(self, dtype: np.dtype, count: int) -> npt.NDArray[np.generic]:
        size = dtype.itemsize * count
        if self._pos + size > len(self._body):
            raise CorruptBlob(f"part blob truncated: need {size} bytes at offset {self._pos} of {len(self._body)}")
        out = _unshuffle(self._body[self._pos : self._pos + size], dtype, count)
        self._pos += size
        return out

    def done(self) -> None:
        if self._pos != len(self._body):
            raise CorruptBlob(f"part blob has {len(self._body) - self._pos} trailing bytes")
