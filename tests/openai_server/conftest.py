"""Fixtures of the OpenAI server's in-process tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenrouter.text import TextCodec


@pytest.fixture(scope="session")
def tiny_codec(tiny_pair: dict[str, Path]) -> TextCodec:
    return TextCodec.from_path(tiny_pair["small"], chat_template=True)
