"""``vllm_stream_interval_wide`` in a config file: a bad value is refused with the
file and the field named, before anything starts; a good one loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.config import load_section
from harnessrl.errors import ConfigError
from services.gateway.settings import Settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "greater than or equal to 1"),
        ("5000", "less than or equal to 4096"),
        ("'wide'", "vllm_stream_interval_wide:"),
        ("-3", "greater than or equal to 1"),
    ],
)
def test_a_bad_wide_interval_names_the_file_and_the_field(tmp_path: Path, value: str, expected: str) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(f"[gateway]\nvllm_stream_interval_wide = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_section(Settings, path, "gateway")
    assert str(path) in str(info.value) and "vllm_stream_interval_wide" in str(info.value)
    assert expected in str(info.value)


def test_a_wide_interval_loads(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text("[gateway]\nvllm_stream_interval_wide = 128\n")
    assert load_section(Settings, path, "gateway").vllm_stream_interval_wide == 128
    assert Settings().vllm_stream_interval_wide == 64
