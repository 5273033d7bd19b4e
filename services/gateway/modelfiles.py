"""Reading what engines need from a plain Hugging Face model folder: the
tokenizer (the fast ``tokenizers`` library, no transformers import), the
end-of-turn token and the context window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from e
    return data if isinstance(data, dict) else {}


def check_model_dir(model_dir: Path) -> Path:
    if not (model_dir / "config.json").exists():
        raise ConfigError(
            f"{model_dir}: not a model folder (no config.json); run scripts/setup or set the gateway's model_path"
        )
    return model_dir


def load_tokenizer(model_dir: Path) -> Any:
    """The model's fast tokenizer (``tokenizers.Tokenizer``) from tokenizer.json."""
    from tokenizers import Tokenizer

    path = check_model_dir(model_dir) / "tokenizer.json"
    if not path.exists():
        raise ConfigError(f"{model_dir}: no tokenizer.json")
    return Tokenizer.from_file(str(path))


def eos_token_id(model_dir: Path, tokenizer: Any | None = None) -> int:
    """The end-of-turn id: the tokenizer's ``eos_token`` (the chat template's
    end marker), else generation_config's, else config's."""
    tok_config = _read_json(model_dir / "tokenizer_config.json")
    eos = tok_config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str):
        tokenizer = tokenizer or load_tokenizer(model_dir)
        found = tokenizer.token_to_id(eos)
        if found is not None:
            return int(found)
    for name in ("generation_config.json", "config.json"):
        value = _read_json(model_dir / name).get("eos_token_id")
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int):
            return value
    raise ConfigError(f"{model_dir}: cannot find an eos token id")


def model_config(model_dir: Path) -> dict[str, Any]:
    config = _read_json(check_model_dir(model_dir) / "config.json")
    # Multimodal / nested configs keep the language model's fields under text_config.
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def context_window(model_dir: Path) -> int:
    config = model_config(model_dir)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    raise ConfigError(f"{model_dir}/config.json: no max_position_embeddings; set the gateway's context_window")


def vocab_size(model_dir: Path) -> int:
    value = model_config(model_dir).get("vocab_size")
    if not isinstance(value, int):
        raise ConfigError(f"{model_dir}/config.json: no vocab_size")
    return value
