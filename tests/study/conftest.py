"""Fixtures of the study tests: the shared enwik8 prefix and a tiny study recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_ENWIK8 = Path(__file__).resolve().parents[3] / "shared" / "data" / "enwik8_prefix.xml"


@pytest.fixture(scope="session")
def enwik8_path() -> Path:
    if not SHARED_ENWIK8.is_file():
        pytest.skip(f"needs {SHARED_ENWIK8} (the project's ../shared data)")
    return SHARED_ENWIK8


@pytest.fixture
def tiny_overrides(enwik8_path) -> list[str]:
    """study-ci shrunk further: one model-size unit test in a few seconds."""
    return [f"data.path={enwik8_path}", "data.max_bytes=60000", "train.tokens=1024", "train.batch_tokens=256",
            "contexts=[32, 64]", "eval.tokens=512", "train.checkpoint_every=2", "model.hidden_size=16",
            "model.intermediate_size=48"]
