"""Reuse Triton's autotuning results across cases, runs and machines.

Triton (3.2+; ``triton.runtime.autotuner.Autotuner.check_disk_cache``) can store each
autotuner's timings as ``<TRITON_CACHE_DIR>/<sha256>/<kernel>.autotune.json``, keyed by the
Triton version, the GPU target, the kernel source, the tuning key (e.g. the shape) and the
configs. A later process with the same cache directory then skips the benchmark of every
config and only compiles the chosen one. It is on for an autotuner declared with
``cache_results=True`` (fla-core 0.6.0 does that for its kernels unless
``FLA_CACHE_RESULTS=0``) and for every autotuner when ``TRITON_CACHE_AUTOTUNING=1``
(``triton.knobs.autotuning.cache``; ours, mlstm_kernels, Mamba 2's SSD).

FLA's ``chunk_gla`` autotunes for minutes per shape on its first call: with the cache kept
(``tflabench run --triton-cache DIR``, or the ``pack``/``unpack`` steps of the device
scripts) that is paid once per shape and Triton version, not once per run. The tuning
time a run still pays stays in each row's ``first_call_s``.

Only the small ``*.autotune.json`` files are needed to skip the tuning; :func:`pack` copies
those (a few kB each) so that they can travel with a checkout, where the compiled kernels
(MBs) would not.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tflabench.errors import UserError

AUTOTUNE_SUFFIX = ".autotune.json"


def configure(cache_dir: str | Path, *, autotune_all: bool = True, environ=os.environ) -> Path:
    """Point Triton's cache at ``cache_dir`` (created) for this process and the workers it
    starts later: sets ``TRITON_CACHE_DIR`` (absolute) and, with ``autotune_all``,
    ``TRITON_CACHE_AUTOTUNING=1``. Call before any worker starts. Returns the directory.

    Raises:
        UserError: the directory cannot be created.
    """
    path = Path(cache_dir).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--triton-cache={str(cache_dir)!r}: cannot create it ({exc.strerror or exc})") from None
    environ["TRITON_CACHE_DIR"] = str(path)
    if autotune_all:
        environ["TRITON_CACHE_AUTOTUNING"] = "1"
    return path


def default_cache_dir(environ=os.environ) -> Path:
    """The directory Triton uses: ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``
    (``TRITON_HOME`` defaulting to the home directory), as ``triton.knobs.cache.dir``."""
    if environ.get("TRITON_CACHE_DIR"):
        return Path(environ["TRITON_CACHE_DIR"])
    return Path(environ.get("TRITON_HOME") or os.path.expanduser("~")) / ".triton" / "cache"


def autotune_entries(cache_dir: str | Path) -> list[Path]:
    """The ``*.autotune.json`` files under ``cache_dir`` (empty when it does not exist)."""
    root = Path(cache_dir)
    if not root.is_dir():
        return []
    return sorted(root.glob(f"*/*{AUTOTUNE_SUFFIX}"))


def pack(cache_dir: str | Path, dest: str | Path) -> int:
    """Copy the autotune results (only ``<hash>/<kernel>.autotune.json``) of ``cache_dir``
    into ``dest`` with the same layout; returns how many files were copied."""
    n = 0
    for f in autotune_entries(cache_dir):
        target = Path(dest) / f.parent.name / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        n += 1
    return n


def unpack(src: str | Path, cache_dir: str | Path) -> int:
    """Copy packed autotune results from ``src`` into ``cache_dir`` (existing files are
    kept); returns how many were copied."""
    n = 0
    for f in autotune_entries(src):
        target = Path(cache_dir) / f.parent.name / f.name
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        n += 1
    return n


def status(environ=os.environ) -> str:
    """One line for ``doctor``: where Triton caches, whether every autotuner's results are
    kept, and how many are there."""
    d = default_cache_dir(environ)
    every = environ.get("TRITON_CACHE_AUTOTUNING", "").lower() in ("1", "true", "on", "yes")
    fla = environ.get("FLA_CACHE_RESULTS", "1") == "1"
    return (f"{d} ({len(autotune_entries(d))} autotune results); every autotuner cached: "
            f"{'yes' if every else 'no (TRITON_CACHE_AUTOTUNING unset)'}; fla's own: "
            f"{'yes' if fla else 'no (FLA_CACHE_RESULTS=0)'}")


def main(argv: list[str] | None = None) -> int:
    """``python -m tflabench.triton_cache pack|unpack SRC DEST`` (for the device scripts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] not in ("pack", "unpack"):
        print("usage: python -m tflabench.triton_cache pack CACHE_DIR DEST | unpack SRC CACHE_DIR", file=sys.stderr)
        return 2
    n = (pack if args[0] == "pack" else unpack)(args[1], args[2])
    print(f"{args[0]}: {n} autotune result(s) {args[1]} -> {args[2]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
