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

**Autotuning scope.** An autotuner's results are keyed by its ``key`` arguments, and those
of fla-core 0.6.0 name the head dimensions and the chunk size but not the batch or the
sequence length. Kept across the cases of a fixed-token sweep, the config tuned at the first
shape ran FLA ``chunk_simple_gla`` slower at the long sequences than one tuned at their own
shapes (docs/harness.md, "Autotuning scope"; ``benchmarks/fla_autotune_scope.py``).
So by default (scope "case") every case tunes at its own shape, as a process that runs only
that shape would: the worker forgets every autotuner's results before each case
(:func:`forget_autotuning`) and does not read or write the disk cache for them
(``FLA_CACHE_RESULTS=0``). ``--triton-cache DIR`` (scope "run") keeps them, trading that for
the minutes FLA ``chunk_gla`` tunes per shape.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

from tflabench.errors import UserError

AUTOTUNE_SUFFIX = ".autotune.json"

#: Environment variable the workers read: "case" (default) or "run" (set by :func:`configure`).
SCOPE_ENV = "TFLABENCH_AUTOTUNE_SCOPE"


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
    environ[SCOPE_ENV] = "run"
    return path


def autotune_scope(environ=os.environ) -> str:
    """How long a worker keeps autotuning results: "case" (the default: each case tunes at
    its own shape) or "run" (kept across cases and, on disk, across runs; ``--triton-cache``)."""
    return "run" if environ.get(SCOPE_ENV, "case") == "run" else "case"


def prepare_worker(environ=os.environ) -> str:
    """Called by a worker before anything imports a peer: in scope "case", fla's autotuners
    are created without their disk cache (``FLA_CACHE_RESULTS=0`` unless set). Returns the
    scope."""
    scope = autotune_scope(environ)
    if scope == "case":
        environ.setdefault("FLA_CACHE_RESULTS", "0")
    return scope


def forget_autotuning(modules=None) -> int:
    """Make every Triton autotuner of the loaded modules tune again at its next call: clear
    its in-memory results and switch off its disk cache. Autotuners are found as module
    attributes, also behind wrappers that hold them as ``.fn`` (``triton.heuristics``).
    ``modules``: the module objects to search (default: ``sys.modules``). Returns how many
    autotuners were reset; 0 when Triton was never imported."""
    if "triton" not in sys.modules and modules is None:
        return 0
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import KernelInterface

    seen: set[int] = set()
    reset = 0
    mods = list(sys.modules.values()) if modules is None else list(modules)
    # Looking at every attribute of every module touches deprecated ones (torch.distributed's
    # ``reduce_op`` warns on isinstance): those warnings are not the case's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in mods:
            try:
                attrs = list(vars(mod).values())
            except TypeError:
                continue
            for obj in attrs:
                # Heuristics -> Autotuner -> JITFunction, each holding the next as .fn
                while isinstance(obj, KernelInterface) and id(obj) not in seen:
                    seen.add(id(obj))
                    if isinstance(obj, Autotuner):
                        obj.cache.clear()
                        obj.cache_results = False
                        reset += 1
                    obj = getattr(obj, "fn", None)
    return reset


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
            f"{'yes' if fla else 'no (FLA_CACHE_RESULTS=0)'}; autotuning scope in `run`: "
            f"{autotune_scope(environ)}")


def main(argv: list[str] | None = None) -> int:
    """``python -m tflabench.run.triton_cache pack|unpack SRC DEST`` (for the device scripts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] not in ("pack", "unpack"):
        print("usage: python -m tflabench.run.triton_cache pack CACHE_DIR DEST | unpack SRC CACHE_DIR", file=sys.stderr)
        return 2
    n = (pack if args[0] == "pack" else unpack)(args[1], args[2])
    print(f"{args[0]}: {n} autotune result(s) {args[1]} -> {args[2]}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
