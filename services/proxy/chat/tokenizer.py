"""The model's tokenizer (the Rust ``tokenizers`` library on the folder's
tokenizer.json), with the special tokens templates are rendered with and an
incremental detokenizer for streaming."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as _RustTokenizer
from tokenizers import decoders
from tokenizers.decoders import DecodeStream

from harnessrl.arrays import I32
from harnessrl.errors import ConfigError


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Encodes text exactly as ``apply_chat_template(tokenize=True)`` does
    (special tokens in the text are parsed, none are added)."""

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{model_dir}: no tokenizer.json (not a Hugging Face model folder?)")
        self._tok = _RustTokenizer.from_file(str(path))
        config = _read_json(model_dir / "tokenizer_config.json")
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        eos = self.special_tokens.get("eos_token")
        eos_id = self._tok.token_to_id(eos) if eos is not None else None
        if eos is None or eos_id is None:
            raise ConfigError(f"{model_dir}: tokenizer_config.json names no usable eos_token")
        self.eos_text = eos
        self.eos_id = int(eos_id)
        stop = {self.eos_id}
        gen = _read_json(model_dir / "generation_config.json").get("eos_token_id")
        stop.update(gen if isinstance(gen, list) else [gen] if isinstance(gen, int) else [])
        self.stop_ids = sorted(stop)
        self._added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        self._byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
        self._bytes: dict[int, bytes] = {}

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=I32)

    def decode(self, ids: list[int] | np.ndarray, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self._tok)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for on its own (a byte-level token may be part
        of a UTF-8 character); special tokens are their text. Cached per id."""
        out = self._bytes.get(token_id)
        if out is None:
            out = self._bytes[token_id] = self._raw_bytes(token_id)
        return out

    def _raw_bytes(self, token_id: int) -> bytes:
        added = self._added.get(token_id)
        if added is not None:
            return added.encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            return bytes(_UNICODE_TO_BYTE.get(c, 0x3F) for c in piece)
        if m := _BYTE_FALLBACK.fullmatch(piece):  # SentencePiece byte fallback, e.g. <0xE2>
            return bytes([int(m[1], 16)])
        return piece.replace("\u2581", " ").encode()


class IncrementalDecoder:
    """Turns sampled ids into text as they arrive (handles multi-byte characters
    split across tokens); special tokens such as eos produce no text."""

    def __init__(self, tok: _RustTokenizer) -> None:
        self._tok = tok
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[np.ndarray] = []
        self._text: list[str] = []
        self._holding = False

    def steps(self, ids: np.ndarray) -> str:
        """The text of one chunk of ids, in one call into the Rust decoder (a
        streamed chunk is many ids). A chunk whose text ends inside a character is
        held whole until the next one completes it; ``flush`` ends the reply."""
        self._ids.append(ids)
        # one id as an int: the Rust call takes ~1.5 us more for a one-id list
        text = self._stream.step(self._tok, int(ids[0]) if len(ids) == 1 else ids.tolist())
        self._holding = text is None
        if text:
            self._text.append(text)
        return text or ""

    @property
    def holding(self) -> bool:
        """The ids so far end inside a character: their text comes with the next ids."""
        return self._holding

    def flush(self) -> str:
        """What the last chunks hold once no more ids come: their complete
        characters (a trailing partial one has no text), as one id at a time gives."""
        if not self._holding:
            return ""
        whole = str(self._tok.decode(np.concatenate(self._ids).tolist(), skip_special_tokens=True))
        done = "".join(self._text)
        rest = whole[len(done) :].rstrip("\ufffd") if whole.startswith(done) else ""
        if rest:
            self._text.append(rest)
        self._holding = False
        return rest


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}
