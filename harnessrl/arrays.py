"""Pack and unpack the token arrays of ``harnessrl.v1`` records.

Arrays cross the wire as little-endian bytes (see records.proto) so that a
long trajectory reaches numpy without a Python object per token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from harnessrl.errors import InvalidArgument
from harnessrl.v1 import records_pb2

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")
U8 = np.dtype("u1")


def pack_i32(values: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    return np.asarray(values, dtype=I32).tobytes()


def pack_f32(values: Sequence[float] | npt.NDArray[np.floating]) -> bytes:
    return np.asarray(values, dtype=F32).tobytes()


def unpack_i32(data: bytes, field: str = "ids") -> npt.NDArray[np.int32]:
    if len(data) % 4:
        raise InvalidArgument(f"{field}: {len(data)} bytes is not a whole number of int32")
    return np.frombuffer(data, dtype=I32)


def unpack_f32(data: bytes, field: str = "logprobs") -> npt.NDArray[np.float32]:
    if len(data) % 4:
        raise InvalidArgument(f"{field}: {len(data)} bytes is not a whole number of float32")
    return np.frombuffer(data, dtype=F32)


def make_tokens(
    ids: Sequence[int] | npt.NDArray[np.integer],
    mask: Sequence[int] | npt.NDArray[np.integer],
    logprobs: Sequence[float] | npt.NDArray[np.floating],
    policy_versions: Sequence[int] | npt.NDArray[np.integer],
    routed_experts: npt.NDArray[np.uint8] | None = None,
) -> records_pb2.TokenArrays:
    """Builds a TokenArrays message; raises InvalidArgument if the lengths disagree."""
    msg = records_pb2.TokenArrays(
        ids=pack_i32(ids),
        mask=np.asarray(mask, dtype=U8).tobytes(),
        logprobs=pack_f32(logprobs),
        policy_versions=pack_i32(policy_versions),
    )
    if routed_experts is not None:
        msg.routed_experts.CopyFrom(pack_routes(routed_experts))
    validate_tokens(msg)
    return msg


def pack_routes(routes: npt.NDArray[np.uint8]) -> records_pb2.RoutedExperts:
    """``routes`` has shape [tokens, layers, top_k]."""
    arr = np.ascontiguousarray(routes, dtype=U8)
    if arr.ndim != 3:
        raise InvalidArgument(f"routed_experts: expected 3 dims [tokens, layers, top_k], got {arr.shape}")
    n, layers, k = arr.shape
    return records_pb2.RoutedExperts(data=arr.tobytes(), num_tokens=n, num_layers=layers, top_k=k)


def unpack_routes(msg: records_pb2.RoutedExperts) -> npt.NDArray[np.uint8] | None:
    if not msg.data:
        return None
    shape = (msg.num_tokens, msg.num_layers, msg.top_k)
    if len(msg.data) != shape[0] * shape[1] * shape[2]:
        raise InvalidArgument(f"routed_experts: {len(msg.data)} bytes do not match shape {shape}")
    return np.frombuffer(msg.data, dtype=U8).reshape(shape)


def validate_tokens(msg: records_pb2.TokenArrays) -> int:
    """Checks that every array of ``msg`` has the same length; returns it."""
    n = len(unpack_i32(msg.ids, "ids"))
    lengths = {
        "mask": len(msg.mask),
        "logprobs": len(unpack_f32(msg.logprobs, "logprobs")),
        "policy_versions": len(unpack_i32(msg.policy_versions, "policy_versions")),
    }
    for name, length in lengths.items():
        if length != n:
            raise InvalidArgument(f"{name} has {length} entries but ids has {n}")
    routes = unpack_routes(msg.routed_experts)
    if routes is not None and routes.shape[0] != n:
        raise InvalidArgument(f"routed_experts has {routes.shape[0]} tokens but ids has {n}")
    return n
