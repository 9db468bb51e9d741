"""Commands: (being written)."""

from tflabench.cli import app, user_errors  # noqa: F401
