"""``optimal-chunk --measure``: sweep a chunked mLSTM kernel's chunk size through the normal
``run`` machinery and set the measurement beside the model's optimum.

:func:`sweep_suite` writes an ordinary suite (one kernel entry per ``--kernel``, its
``chunk_size`` a list, one shape, the chosen modes); :func:`measure_chunk_sweep` runs it
with :func:`tflabench.run.suite_run.run_suite` (isolated workers, warm-up, numerics gate, peak
memory, one row per case and mode) and analyses the rows with
:func:`tflabench.analysis.model_vs_measured.chunk_sweeps`. Nothing here times anything itself:
"one timing function" stays :mod:`tflabench.run.measure`.

Kernels (``--kernel``): ``ours`` (backend ``tfla``, xl_chunk), ``mlstm_kernels`` (the
authors' xl_chunk, mLSTMsig with ``normalize: false`` as the paper), or a custom kernel
``module:function`` / ``path/file.py:function`` (backend ``custom``, layout mlstm, called
with ``chunk_size=``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tflabench.errors import UserError
from tflabench.store.results import load_results
from tflabench.store.suite import load_suite
from tflabench.run.suite_run import run_suite

#: Chunk sizes swept by default (paper Figure 5: 64 ... 1024).
DEFAULT_CHUNK_SIZES = (64, 128, 256, 512, 1024)
BUILTIN_KERNELS = ("ours", "mlstm_kernels")


@dataclasses.dataclass
class SweepSpec:
    """What to sweep: kernels (``ours``, ``mlstm_kernels`` or ``module:function``), mLSTM
    ``variant``, shape (``batch``, ``seq_len``, ``heads``, ``d_qk``, ``d_hv``; layout (B, NH, S, D)),
    ``chunk_sizes`` (tokens), ``modes``, ``dtype`` and timing (``warmup``, ``iterations``,
    ``timeout_s`` per case)."""

    kernels: list[str]
    variant: str = "sig"
    batch: int = 8
    seq_len: int = 8192
    heads: int = 8
    d_qk: int = 256
    d_hv: int = 512
    chunk_sizes: tuple[int, ...] = DEFAULT_CHUNK_SIZES
    modes: tuple[str, ...] = ("fwd", "fwdbw")
    dtype: str = "bfloat16"
    warmup: int = 10
    iterations: int = 30
    timeout_s: float = 300.0

    def validate(self) -> "SweepSpec":
        """Check every field; raises UserError naming the option and the allowed values."""
        if not self.kernels:
            raise UserError("--kernel: give at least one kernel (ours, mlstm_kernels or module:function)")
        for k in self.kernels:
            if k not in BUILTIN_KERNELS and not re.match(r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$", k):
                raise UserError(f"--kernel={k!r} is not valid; allowed: ours, mlstm_kernels, or a custom "
                                "kernel as module:function or path/file.py:function")
        if self.variant not in ("sig", "exp"):
            raise UserError(f"--variant={self.variant!r} is not valid; allowed: sig|exp")
        for name in ("batch", "seq_len", "heads", "d_qk", "d_hv", "iterations"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"--{name.replace('_', '-')}={v!r} is not valid; it must be a positive integer")
        if self.warmup < 0:
            raise UserError(f"--warmup={self.warmup!r} is not valid; it must be >= 0")
        Ls = sorted(set(self.chunk_sizes))
        if len(Ls) < 2:
            raise UserError(f"--chunk-size={','.join(map(str, self.chunk_sizes))}: a sweep needs two or more "
                            "chunk sizes")
        for L in Ls:
            if L < 1 or L > self.seq_len or self.seq_len % L:
                raise UserError(f"--chunk-size={L} is not valid; each L must divide the sequence length "
                                f"(1 <= L <= T, T % L == 0; T={self.seq_len})")
        self.chunk_sizes = tuple(Ls)
        for m in self.modes:
            if m not in ("fwd", "fwdbw"):
                raise UserError(f"--mode={','.join(self.modes)!r} is not valid; allowed: fwd, fwdbw")
        if self.dtype not in ("bfloat16", "float16", "float32", "float64"):
            raise UserError(f"--dtype={self.dtype!r} is not valid; allowed: bfloat16|float16|float32|float64")
        return self

    @property
    def name(self) -> str:
        """Suite name (the result set's directory): kernels, variant and shape."""
        ks = "_".join(re.sub(r"[^A-Za-z0-9]+", "-", k).strip("-") for k in self.kernels)
        return (f"optimal_chunk_{ks}_{self.variant}_B{self.batch}_S{self.seq_len}_NH{self.heads}"
                f"_{self.d_qk}x{self.d_hv}")


def kernel_entry(kernel: str, spec: SweepSpec) -> dict:
    """The suite's ``kernels[]`` entry of one ``--kernel`` (backend, label, params)."""
    layout = {"heads": spec.heads, "d_qk": spec.d_qk, "d_hv": spec.d_hv}
    Ls = list(spec.chunk_sizes)
    if kernel == "ours":
        return {"backend": "tfla", "label": f"mLSTM{spec.variant} TFLA xl_chunk (ours)",
                "params": {"variant": spec.variant, "algorithm": "xl_chunk", "chunk_size": Ls, **layout}}
    if kernel == "mlstm_kernels":
        params = {"variant": spec.variant, "algorithm": "xl_chunk", "chunk_size": Ls, **layout}
        if spec.variant == "sig":
            params["normalize"] = False
        return {"backend": "mlstm_kernels", "label": f"mLSTM{spec.variant} TFLA xl_chunk (mlstm_kernels)",
                "params": params}
    return {"backend": "custom", "label": kernel,
            "params": {"function": kernel, "layout": "mlstm", "variant": spec.variant, "chunk_size": Ls, **layout}}


def sweep_suite(spec: SweepSpec, *, device: str = "cuda") -> dict:
    """The suite (as a dict, the YAML schema of :mod:`tflabench.store.suite`) that sweeps the chunk size."""
    spec.validate()
    return {
        "name": spec.name,
        "description": (f"optimal-chunk --measure: mLSTM{spec.variant} chunk size "
                        f"{','.join(map(str, spec.chunk_sizes))} at B={spec.batch} S={spec.seq_len} "
                        f"NH={spec.heads} d_qk={spec.d_qk} d_hv={spec.d_hv}"),
        "device": device,
        "dtype": spec.dtype,
        "modes": list(spec.modes),
        "timing": {"warmup": spec.warmup, "iterations": spec.iterations, "timeout_s": float(spec.timeout_s)},
        "numerics": {"check": True, "max_seq_len": 512},
        "model": {"embedding_dim": spec.heads * spec.d_hv},
        "sweep": {"batch": spec.batch, "seq_len": spec.seq_len},
        "kernels": [kernel_entry(k, spec) for k in spec.kernels],
    }


def write_suite(suite: dict, directory: str | Path) -> Path:
    """Write ``suite`` as ``<directory>/<name>.yaml`` (kept: the result set's metadata names
    it and records its sha256). Raises UserError when it cannot be written."""
    import yaml

    path = Path(directory) / f"{suite['name']}.yaml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# written by tflabench optimal-chunk --measure\n"
                        + yaml.safe_dump(suite, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the sweep's suite {str(path)!r}: {exc.strerror or exc}") from None
    return path


def require_gpu() -> None:
    """Raise UserError (one line) unless torch sees a CUDA GPU: the measured sweep times
    kernels on a GPU only."""
    import torch

    if not torch.cuda.is_available():
        raise UserError("optimal-chunk --measure needs a CUDA GPU and torch sees none; without --measure it "
                        "prints the model's optima, and `tflabench report RESULTS` draws the figure from an "
                        "existing chunk-size sweep (e.g. results/reference/h200/chunk_tradeoff)")


def measure_chunk_sweep(spec: SweepSpec, *, out_root: str | Path = "results", device: str = "cuda",
                        progress: bool = True):
    """Run the sweep through :func:`tflabench.run.suite_run.run_suite` and return
    ``(RunResult, ResultSet)``. ``device``: ``cuda`` (what the CLI uses) or ``cpu`` (tests:
    the tfla backend then runs its PyTorch reference). The suite file goes to
    ``<out_root>/suites/<name>.yaml``, the result set to ``<out_root>/<name>/<timestamp>/``."""
    suite = sweep_suite(spec, device=device)
    path = write_suite(suite, Path(out_root) / "suites")
    loaded = load_suite(path)
    result = run_suite(loaded, out_root=out_root, device=device, progress=progress)
    return result, load_results(result.directory)


__all__ = ["BUILTIN_KERNELS", "DEFAULT_CHUNK_SIZES", "SweepSpec", "kernel_entry", "measure_chunk_sweep",
           "require_gpu", "sweep_suite", "write_suite"]
