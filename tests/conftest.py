"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def isolated_user_files(tmp_path, monkeypatch):
    """No test reads the real ~/.config/tflabench/gpus.yaml (measured ceilings) or
    $TFLABENCH_HARDWARE: HOME points into tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TFLABENCH_HARDWARE", raising=False)
