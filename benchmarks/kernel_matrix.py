"""Every configuration the dispatch of ``tfla.mlstm_sig`` / ``tfla.mlstm_exp`` can choose:
compiled for sm_90 without a GPU, or run on a GPU against the float64 reference.

The matrix (:func:`cases`) crosses variant (mLSTMsig, mLSTMexp), algorithm and chunk size
(``xl_chunk`` at 16 to 1024 and "auto", ``limit_chunk`` at 16 to 128, and for mLSTMsig a
call without gradients and without the normaliser at 64, 128 and "auto", which the forward
walk takes where its rule allows) and q/k/v dtype (float32, bfloat16, float16). Each such
cell is called with two head pairs out of :data:`HEADS` (the paper's, pairs that are not
powers of two, an odd pair whose rows forbid TMA tiles), chosen so that every head pair
meets every chunk and every dtype. The other axes turn along the enumeration so that each
of their values meets every variant, chunk and dtype: gate dtype (float32, bfloat16,
float16), initial state (none, or C0 and n0 (and m0) in float32 or in q's dtype), last
state, normaliser (mLSTMsig), a sequence ending in a partial chunk, one shorter than the
chunk, or whole chunks, and the grid (see below). :data:`EXTRA` adds the largest head
mLSTMsig accepts (1024), the reported defect (mLSTMexp, chunk 256, 16-bit gates),
mLSTMsig's training walk (with gradients under "auto" on a full grid), the walk over
sequence segments, and mLSTMsig in 16-bit at Figure 5's heads with gradients (under "auto"
at L 256, and at L 128). Each
case calls the public function and its backward, so the algorithm and every launch
configuration come from the dispatch itself.

The grid: the dispatch compares a launch's programs with the SM count (the state kernels'
block halving, the walk's 1.2 programs per SM). ``large`` runs as if the grid filled the
GPU (SM count 0: no bound, as in Triton's interpreter), ``small`` as a call on a GPU with
132 SMs (H100 SXM, H200) at B 1, NH 2, ``few_sms`` on a GPU of 8 SMs, where mLSTMsig's
walk runs over sequence segments (:data:`EXTRA`).

Modes:

``--compile-only`` (any machine, no GPU): CPU tensors take the Triton path while the
kernels are compiled, not interpreted, for sm_90 (``GPUTarget("cuda", 90, 128)``): each
launch goes through Triton's own argument binder (the launcher's specialisation: dtypes,
16-byte alignment, integers equal to 1 or divisible by 16, tensor descriptors) and is
compiled instead of launched; a kernel whose shared memory exceeds the 232,448 bytes of an
sm_90 block raises OutOfResources as the launch would, so the launch's retry with fewer
pipeline stages runs as on the GPU. Identical specialisations compile once.

default (a CUDA GPU): each case runs once per gate regime of ``tflabench.numerics.REGIMES``
(forget gates saturated open and closed, input gates huge and tiny, wide, q and k scaled);
its output, last state and gradients (dq, dk, dv, di, df, dC0) are judged against
``tfla.reference.mlstm_chunkwise`` in float64 with the budgets of ``tflabench.numerics``
(the harness's numerics gate; df against the scale of its summands).

``--smoke``: the default mode's code on a few tiny cases (:data:`SMOKE`) in Triton's CPU
interpreter (TRITON_INTERPRET=1), so that the script is exercised without a GPU.

Prints one line per failing row (every row without ``--quiet``) and a summary; with
``--out DIR`` writes ``kernel_matrix.csv`` (one row per case and regime: the configuration,
the max-normalised error of every tensor, ok/fail, the error) and ``summary.json``. Exit
status 1 if any row fails, 2 for bad options.

    python benchmarks/kernel_matrix.py --compile-only --jobs 2   # CPU, sm_90
    python benchmarks/kernel_matrix.py --jobs 8 --out results/kernel_matrix   # on a GPU
    python benchmarks/kernel_matrix.py --smoke                   # CPU, interpreter

``--machine-code FILE`` (with ``--compile-only``) writes each compiled kernel's name and the
sha256 of its cubin; with ``--root DIR`` the same for another checkout's kernels, so that two
files equal say that a change left the kernels' sm_90 machine code as it was. Compile both
without line information (``TRITON_DISABLE_LINE_INFO=1``: a cubin otherwise carries its source
file's path and line numbers) and each into an empty Triton cache:

    TRITON_DISABLE_LINE_INFO=1 TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/kernel_matrix.py \
        --compile-only --shard 1/16 --machine-code after.txt
    TRITON_DISABLE_LINE_INFO=1 TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/kernel_matrix.py \
        --compile-only --shard 1/16 --root OLD --machine-code before.txt
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import json
import os
import sys
import time

#: the checkout whose kernels are compiled or run: this one, or ``--root``'s (passed to the
#: worker processes through the environment)
ROOT = os.path.abspath(os.environ.get("KERNEL_MATRIX_ROOT")
                       or os.path.join(os.path.dirname(__file__), ".."))

CHUNKS = (16, 32, 64, 128, 256, 512, 1024)
DTYPES = ("bfloat16", "float16", "float32")
GATE_DTYPES = ("float32", "bfloat16", "float16")
#: (d_qk, d_hv): the paper's three head pairs, pairs that are not powers of two (16-byte
#: rows: TMA tiles allowed), and an odd pair (pointer loads, no divisibility by 16)
HEADS = ((64, 128), (128, 256), (256, 512), (48, 96), (160, 192), (33, 65))
SMALL_GRID_SMS = 132
#: the SM count of the "few_sms" grid, where the walk runs over sequence segments
FEW_SMS = 8
SM90_MAX_SHARED = 232448       # bytes of shared memory one sm_90 block may use (227 KiB)
B, NH = 1, 2
#: the compared tensors, in the order of the CSV's error columns
TENSORS = ("out", "last_C", "last_n", "last_m", "dq", "dk", "dv", "di", "df", "dC0")
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One call of the public function (and its backward where ``grad``)."""

    variant: str            # "sig" | "exp"
    algorithm: str          # "xl_chunk" | "limit_chunk" (the walk is xl_chunk's choice)
    chunk: int | str        # chunk_size as passed: a power of two or "auto"
    dtype: str              # q, k, v
    gate_dtype: str         # i, f
    d_qk: int
    d_hv: int
    S: int
    initial_state: str      # "" (none) or the dtype of C0, n0 (m0)
    last_state: bool
    normalize: bool         # mLSTMsig's normaliser (mLSTMexp always normalises)
    grad: bool
    grid: str               # "large" | "small" | "few_sms"

    @property
    def label(self) -> str:
        flags = "".join(c for c, on in (("C", self.initial_state), ("L", self.last_state),
                                        ("N", self.normalize and self.variant == "sig"))
                        if on) or "-"
        init = f" C0 {SHORT[self.initial_state]}" if self.initial_state else ""
        return (f"{self.variant} {self.algorithm} L={self.chunk} {SHORT[self.dtype]}/"
                f"gates {SHORT[self.gate_dtype]} {self.d_qk}x{self.d_hv} S={self.S} "
                f"{'fwd+bwd' if self.grad else 'fwd'} {flags}{init} grid={self.grid}")

    @property
    def n_sms(self) -> int:
        return {"small": SMALL_GRID_SMS, "few_sms": FEW_SMS}.get(self.grid, 0)


def lengths(L: int) -> tuple[int, int, int]:
    """(S ending in a partial chunk after a whole one, S shorter than one chunk, S of two
    whole chunks): all run at chunk L itself (the dispatch clamps L to the padded sequence);
    the first two are not multiples of 16 (the launcher specialises those that are)."""
    return L + 37, L // 2 + 5, 2 * L


def cases() -> list[Case]:
    """The matrix (module docstring): every (variant, algorithm, chunk, dtype) with two head
    pairs, the other axes turning along the enumeration; then :data:`EXTRA`."""
    out: list[Case] = []
    n = 0
    for v, variant in enumerate(("sig", "exp")):
        for d, dtype in enumerate(DTYPES):
            for c, chunk in enumerate(CHUNKS + ("auto",)):
                for p in range(2):
                    # (c + 2d + 3p) mod 6: for a fixed chunk, the three dtypes and two
                    # pairs meet all six head pairs; for a fixed dtype, the chunks do
                    heads = HEADS[(c + 2 * d + v + 3 * p) % len(HEADS)]
                    for k, kind in enumerate(("xl", "limit", "fwd")):
                        L = 128 if chunk == "auto" else chunk
                        if kind == "limit" and (chunk == "auto" or L > 128):
                            continue
                        if kind == "fwd":
                            if variant == "exp" or chunk not in (64, 128, "auto"):
                                continue
                            L = 64 if chunk == "auto" else L     # "auto" walks at 64
                        n += 1
                        init = ("", "float32", "", dtype)[n % 4]
                        out.append(Case(
                            variant=variant,
                            algorithm="limit_chunk" if kind == "limit" else "xl_chunk",
                            chunk=chunk, dtype=dtype, gate_dtype=GATE_DTYPES[(c + d + p + k) % 3],
                            d_qk=heads[0], d_hv=heads[1], S=lengths(L)[(n // 2 + p) % 3],
                            initial_state=init, last_state=(n // 3 + p) % 2 == 1,
                            normalize=variant == "exp" or (kind != "fwd" and (c + d + p) % 2 == 1),
                            grad=kind != "fwd", grid=("large", "small")[(n // 5) % 2]))
    return out + list(EXTRA)


def _extra() -> tuple[Case, ...]:
    big = [Case("sig", "xl_chunk", L, dt, "float32", 1024, 1024, S, "float32", last, norm, grad,
                "large")
           for L, dt, S, last, norm, grad in ((64, "bfloat16", 101, True, True, True),
                                              (128, "float32", 45, False, False, True),
                                              (64, "float16", 64, False, False, False),
                                              (256, "float16", 300, True, False, True))]
    # the reported defect: mLSTMexp, chunk 256, 16-bit gates (the chunk-gates kernel did not
    # compile for sm_90), with a whole and a partial last chunk
    defect = [Case("exp", "xl_chunk", 256, dt, gdt, 64, 128, S, "", False, True, True, "large")
              for dt, gdt, S in (("bfloat16", "bfloat16", 512), ("bfloat16", "float16", 293),
                                 ("float16", "bfloat16", 293), ("float32", "float16", 512))]
    # mLSTMsig with gradients under "auto" on a full grid: the forward walk storing the chunk
    # states of L 128 (every second chunk of 64, the last one after the loop at S 165; every
    # chunk at S 40) before the two-level backward (docs/kernels.md, rule W6)
    train_walk = [Case("sig", "xl_chunk", "auto", dt, gdt, dq, dv, S, init, last, False, True,
                       "large")
                  for dt, gdt, dq, dv, S, init, last in (
                      ("bfloat16", "float32", 128, 256, 165, "bfloat16", True),
                      ("float16", "bfloat16", 48, 96, 256, "float32", False),
                      ("bfloat16", "float16", 64, 128, 40, "", False),
                      ("float16", "float32", 96, 192, 200, "", True))]
    # the walk over sequence segments (rule W7), on a GPU of FEW_SMS SMs: 8 segments without
    # gradients (d_hv in one block), 2 as the training walk (a partial last chunk, C0), 2 at
    # a d_hv of three blocks
    segments = [Case("sig", "xl_chunk", L, dt, gdt, dq, dv, S, init, False, False, grad,
                     "few_sms")
                for L, dt, gdt, dq, dv, S, init, grad in (
                    ("auto", "bfloat16", "float32", 64, 128, 4096, "", False),
                    ("auto", "float16", "bfloat16", 128, 256, 2000, "float32", True),
                    (64, "bfloat16", "float16", 96, 192, 2048, "bfloat16", False))]
    # Figure 5's heads (256 / 512) in 16-bit, where each tile's products are formed once:
    # under "auto" at L 256 (rules C2, H7, B10, B11; two whole chunks and a partial one, one
    # chunk's worth, less than half a chunk; H8's Gluon H kernel without the normaliser, in
    # both 16-bit dtypes) and at L 128 (B10, B11)
    fig5 = [Case("sig", "xl_chunk", L, dt, gdt, 256, 512, S, init, last, norm, True, "large")
            for L, dt, gdt, S, init, last, norm in (
                ("auto", "bfloat16", "float32", 600, "float32", True, False),
                ("auto", "float16", "float16", 700, "", False, False),
                ("auto", "float16", "bfloat16", 293, "", False, True),
                ("auto", "bfloat16", "float16", 100, "bfloat16", False, False),
                (128, "float16", "float32", 300, "float16", True, False))]
    return tuple(big + defect + train_walk + segments + fig5)


EXTRA = _extra()

#: the interpreter's cases (``--smoke``): tiny heads, every path once
SMOKE = (
    Case("sig", "xl_chunk", 16, "float32", "bfloat16", 16, 24, 45, "float32", True, True, True,
         "large"),
    Case("sig", "xl_chunk", 64, "bfloat16", "float32", 16, 24, 77, "", True, False, False,
         "large"),
    Case("sig", "limit_chunk", 32, "float32", "float16", 16, 24, 45, "", False, False, True,
         "small"),
    Case("exp", "xl_chunk", 32, "float16", "float16", 16, 24, 77, "float16", True, True, True,
         "large"),
    Case("exp", "limit_chunk", 16, "float32", "float32", 16, 24, 11, "float32", False, True,
         True, "large"),
)
SMOKE_REGIMES = ("f_closed", "i_open", "wide")


def shard(items: list, spec: str | None) -> list:
    """Items i-1, i-1+n, ... of ``spec`` "i/n" (None: all)."""
    if not spec:
        return items
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise ValueError(f"--shard: got {spec!r}; allowed: i/n with 1 <= i <= n")
    return items[i - 1::n]


# ---------------------------------------------------------------------------- one call

def _inputs(case: Case, device, regime: str | None = None):
    """q, k, v ~ N(0, 1) and gates ĩ ~ N(0, 1), f̃ ~ N(3, 1) (the harness's standard
    inputs), redrawn as ``tflabench.numerics.REGIMES[regime]`` says; the initial state."""
    import torch

    g = torch.Generator().manual_seed(1000 + case.S + case.d_qk)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = {"q": rn(B, NH, case.S, case.d_qk), "k": rn(B, NH, case.S, case.d_qk),
         "v": rn(B, NH, case.S, case.d_hv), "i": rn(B, NH, case.S), "f": rn(B, NH, case.S) + 3}
    if regime is not None:
        from tflabench.numerics import REGIMES

        spec = REGIMES[regime]
        if spec.f is not None:
            x["f"] = rn(B, NH, case.S) * spec.f[1] + spec.f[0]
        if spec.i is not None:
            x["i"] = rn(B, NH, case.S) * spec.i[1] + spec.i[0]
        if spec.qk_scale is not None:
            x["q"], x["k"] = x["q"] * spec.qk_scale, x["k"] * spec.qk_scale
    x = {n: t.to(device=device, dtype=getattr(torch, case.dtype if n in "qkv" else case.gate_dtype))
         for n, t in x.items()}
    init = None
    if case.initial_state:
        sdt = getattr(torch, case.initial_state)
        C0 = (rn(B, NH, case.d_qk, case.d_hv) * 0.5).to(device, sdt)
        n0 = (rn(B, NH, case.d_qk).abs() + 0.5).to(device, sdt)
        init = (C0, n0, rn(B, NH).to(device, sdt)) if case.variant == "exp" else (C0, n0)
    return x, init


def _forward_backward(case: Case, x: dict, init, fn, dh=None, dC=None) -> dict:
    """name -> tensor of one call: out, last_C, last_n (last_m), and with ``grad`` the
    gradients of <out, dh> (+ <last_C, dC>) w.r.t. q, k, v, i, f (and C0)."""
    import torch

    x = {n: t.detach().clone() for n, t in x.items()}
    init = tuple(t.detach().clone() for t in init) if init is not None else None
    leaves = dict(x)
    if init is not None:
        leaves["C0"] = init[0]
    if case.grad:
        for t in leaves.values():
            t.requires_grad_(True)
    kw = dict(initial_state=init, return_last_state=case.last_state)
    if case.variant == "sig":
        kw["normalize"] = case.normalize
    with torch.set_grad_enabled(case.grad):
        out = fn(x["q"], x["k"], x["v"], x["i"], x["f"], **kw)
    h, state = out if case.last_state else (out, None)
    res = {"out": h}
    if state is not None:
        res.update(zip(("last_C", "last_n", "last_m"), state))
    if case.grad:
        dh = torch.ones_like(h) if dh is None else dh.to(h.dtype)
        loss = (h * dh).sum()
        if state is not None:
            loss = loss + (state[0] * (torch.ones_like(state[0]) if dC is None
                                       else dC.to(state[0].dtype))).sum()
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        res.update(("d" + name, gr) for name, gr in zip(leaves, grads))
    return {n: t.detach() for n, t in res.items() if t is not None}


def _kernel_fn(case: Case):
    import tfla

    fn = tfla.mlstm_sig if case.variant == "sig" else tfla.mlstm_exp
    return lambda *a, **kw: fn(*a, chunk_size=case.chunk, algorithm=case.algorithm, **kw)


def _reference_fn(case: Case):
    from tfla.reference import mlstm_chunkwise

    return lambda *a, **kw: mlstm_chunkwise(*a, variant=case.variant, chunk_size=64, **kw)


def compile_case(case: Case) -> list[dict]:
    """Compile every launch of one case for sm_90 (``--compile-only``): one row."""
    import torch

    _GRID["n_sms"] = case.n_sms
    try:
        x, init = _inputs(case, "cpu")
        _forward_backward(case, x, init, _kernel_fn(case))
        problem = None
    except Exception as exc:  # noqa: BLE001 - every failure is a row
        problem = _first_line(exc)
    torch.set_grad_enabled(True)
    return [_row(case, None, problem, {})]


def check_case(case: Case, device: str, regimes) -> list[dict]:
    """Run one case per regime on ``device`` and judge it against float64: one row each."""
    import torch

    from tflabench.numerics import judge, precision, reference_scales

    _GRID["n_sms"] = case.n_sms
    rows = []
    for regime in regimes:
        errors: dict = {}
        raised: dict = {}
        try:
            x, init = _inputs(case, device, regime)
            g = torch.Generator().manual_seed(7)
            dh = torch.randn(B, NH, case.S, case.d_hv, generator=g, dtype=torch.float64).to(device)
            dC = torch.randn(B, NH, case.d_qk, case.d_hv, generator=g,
                             dtype=torch.float64).to(device)
            got = _forward_backward(case, x, init, _kernel_fn(case), dh, dC)
            x64 = {n: t.double() for n, t in x.items()}
            init64 = tuple(t.double() for t in init) if init is not None else None
            ref = _forward_backward(case, x64, init64, _reference_fn(case), dh, dC)
            pairs = {n: (got[n], ref[n]) for n in TENSORS if n in ref}
            missing = sorted(set(ref) - set(got))
            last = ({"last_C": (dC, ref["last_C"])} if case.last_state and case.grad else None)
            raised = storage_floors(pairs, case.dtype)
            verdict = judge(pairs, dtype=case.dtype, tf32=False,
                            overrides={precision(case.dtype, False): raised},
                            scales=reference_scales("mlstm", x64, pairs, last))
            errors = {e.name: e.max_norm for e in verdict.errors}
            problem = (f"missing {', '.join(missing)}" if missing
                       else None if verdict.passed else verdict.reason())
        except Exception as exc:  # noqa: BLE001
            problem = _first_line(exc)
        rows.append(_row(case, regime, problem, errors, raised))
    return rows


def storage_floors(pairs: dict, dtype: str) -> dict[str, float]:
    """Tensor class -> budget, for the classes whose budget (the q/k/v dtype's) is below
    twice the error of the float64 reference itself stored in the dtype the kernel returns
    the tensor in: di, df in the gates' dtype, dC0 in C0's. Where a regime drives a tensor
    into that dtype's subnormals (dC0 ~ 1e-9 in float16 after closed forget gates, di ~ σ(-30)
    in float16), no kernel can be closer than that rounding."""
    from tflabench.numerics import budget, tensor_class, tensor_error

    floors: dict[str, float] = {}
    for name, (x, r) in pairs.items():
        if x.dtype == r.dtype:
            continue
        floor = 2 * tensor_error(name, r.to(x.dtype), r, 1.0).max_norm
        cls = tensor_class(name)
        if floor > max(budget(name, dtype, False), floors.get(cls, 0.0)):
            floors[cls] = floor
    return floors


def path(case: Case, device: str) -> str:
    """What the dispatch runs for this case (``tfla.plan``): "two_level L128", "walk L64",
    "walk_segments L64 x8" (the number of segments), "limit_chunk L32"."""
    import torch

    import tfla

    q = torch.empty(B, NH, case.S, case.d_qk, dtype=getattr(torch, case.dtype), device="meta")
    v = torch.empty(B, NH, case.S, case.d_hv, dtype=q.dtype, device="meta")
    p = tfla.plan(case.variant, q, v, chunk_size=case.chunk, algorithm=case.algorithm,
                  grad=case.grad, normalize=case.normalize and case.variant == "sig",
                  return_last_state=case.last_state, device=device)
    return f"{p.algorithm} L{p.chunk_size}" + (f" x{p.segments}" if p.segments > 1 else "")


def _row(case: Case, regime: str | None, problem: str | None, errors: dict,
         raised: dict | None = None) -> dict:
    try:
        ran = path(case, "cpu" if _GRID.get("cpu") else "cuda")
    except Exception as exc:  # noqa: BLE001
        ran = _first_line(exc)
    row = {"config": case.label, **dataclasses.asdict(case), "path": ran, "regime": regime or "",
           "status": "fail" if problem else "ok", "error": problem or ""}
    row.update({f"err_{n}": errors.get(n, "") for n in TENSORS})
    row["budget_raised"] = json.dumps(raised or {}, sort_keys=True) if raised else ""
    return row


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# ---------------------------------------------------------------------------- set-up

_GRID = {"n_sms": 0}
_STATS: dict = {"launches": 0, "compiled": set(), "machine_code": set()}


def _emulate_sm_count() -> None:
    """The dispatch reads the SM count through ``tfla.triton.common.num_sms``: replace it
    (before the kernel modules bind it) by the case's grid (module docstring)."""
    sys.path[:0] = [os.path.join(ROOT, "kernels"), ROOT]
    import tfla.triton.common as common

    common.num_sms = lambda device: _GRID["n_sms"]


def _set_up_compile_only() -> None:
    """Triton compiles (not interprets) the kernels, for sm_90, without a GPU; the dispatch
    takes the Triton path on CPU tensors."""
    os.environ["TRITON_INTERPRET"] = "0"     # triton's own jit functions: compiled
    import triton
    import triton.experimental.gluon  # noqa: F401  (imports triton's jit helpers now)
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    triton.knobs.runtime.interpret = False   # tfla's kernels: compiled
    os.environ["TRITON_INTERPRET"] = "1"     # the dispatch: the Triton path on CPU tensors

    class CompileOnlyDriver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 128)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    driver.set_active(CompileOnlyDriver())
    run = JITFunction.run

    def compile_instead_of_launch(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        _STATS["launches"] += 1
        _STATS["compiled"].add(kernel.hash)
        _STATS["machine_code"].add((kernel.name, hashlib.sha256(kernel.asm["cubin"]).hexdigest()))
        if kernel.metadata.shared > SM90_MAX_SHARED:
            raise OutOfResources(kernel.metadata.shared, SM90_MAX_SHARED, "shared memory")
        return kernel

    JITFunction.run = compile_instead_of_launch


def _set_up(mode: str) -> None:
    _GRID["cpu"] = mode != "gpu"
    if mode == "compile":
        _set_up_compile_only()
    elif mode == "smoke":
        os.environ["TRITON_INTERPRET"] = "1"
    _emulate_sm_count()


def _run_group(mode: str, group: list[Case]) -> tuple[list[dict], int, set]:
    """Run a group of cases in this process (a pool worker, or the main process)."""
    rows = []
    for case in group:
        if mode == "compile":
            rows += compile_case(case)
        else:
            from tflabench.numerics import REGIMES

            regimes = SMOKE_REGIMES if mode == "smoke" else tuple(REGIMES)
            rows += check_case(case, "cpu" if mode == "smoke" else "cuda", regimes)
    stats = (_STATS["launches"], set(_STATS["compiled"]), set(_STATS["machine_code"]))
    _STATS["launches"], _STATS["compiled"], _STATS["machine_code"] = 0, set(), set()
    return rows, *stats


def groups(items: list[Case]) -> list[list[Case]]:
    """The cases by (variant, dtype, algorithm), largest first: every kernel but the gate
    kernel has q's dtype in its signature, so groups compile few kernels twice."""
    by: dict = {}
    for case in items:
        by.setdefault((case.variant, case.dtype, case.algorithm), []).append(case)
    return sorted(by.values(), key=len, reverse=True)


def run(items: list[Case], mode: str, jobs: int) -> tuple[list[dict], int, int, set]:
    """Every case of ``items`` in ``mode`` ("compile", "gpu", "smoke"), in ``jobs`` worker
    processes (1: this one). Returns (rows, launches, distinct kernels compiled, and their
    machine code as ``(kernel name, sha256 of the cubin)`` pairs)."""
    results = []
    if jobs <= 1:
        _set_up(mode)
        results = [_run_group(mode, g) for g in groups(items)]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_set_up,
                                 initargs=(mode,)) as pool:
            results = list(pool.map(_run_group, [mode] * len(groups(items)), groups(items)))
    order = {c.label: n for n, c in enumerate(items)}
    rows = sorted((r for res in results for r in res[0]), key=lambda r: order[r["config"]])
    compiled = set().union(*(res[2] for res in results)) if results else set()
    machine_code = set().union(*(res[3] for res in results)) if results else set()
    return rows, sum(res[1] for res in results), len(compiled), machine_code


def write(out_dir: str, rows: list[dict], summary: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "kernel_matrix.csv"), "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["config"])
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--compile-only", action="store_true",
                      help="compile every launch for sm_90 on this machine (no GPU needed)")
    mode.add_argument("--smoke", action="store_true",
                      help="a few tiny cases against float64 in Triton's CPU interpreter")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--shard", default=None, help="i/n: every n-th case from the i-th")
    ap.add_argument("--out", default=None, help="directory for kernel_matrix.csv, summary.json")
    ap.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    ap.add_argument("--root", default=None,
                    help="compile or run another checkout's kernels (package tfla under ROOT/kernels)")
    ap.add_argument("--machine-code", default=None, metavar="FILE",
                    help="--compile-only: write each compiled kernel's name and the sha256 of its "
                         "cubin, one sorted line each (two checkouts' files equal: the same machine code)")
    args = ap.parse_args(argv)
    if args.root:
        global ROOT
        ROOT = os.environ["KERNEL_MATRIX_ROOT"] = os.path.abspath(args.root)
    which = "compile" if args.compile_only else "smoke" if args.smoke else "gpu"
    try:
        items = shard(list(SMOKE) if args.smoke else cases(), args.shard)
        if not 1 <= args.jobs <= 64:
            raise ValueError(f"--jobs: got {args.jobs}; allowed: 1 to 64")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if which == "gpu":
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU; use --compile-only (sm_90 without a GPU) or --smoke",
                  file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    rows, launches, compiled, machine_code = run(items, which, args.jobs)
    if args.machine_code and which == "compile":
        with open(args.machine_code, "w") as fh:
            fh.writelines(f"{name} {sha}\n" for name, sha in sorted(machine_code))
    seconds = time.perf_counter() - t0
    failed = [r for r in rows if r["status"] != "ok"]
    for r in rows:
        if r["status"] != "ok" or not args.quiet:
            where = f" [{r['regime']}]" if r["regime"] else ""
            print(f"{'FAIL' if r['status'] != 'ok' else 'ok  '} {r['config']}{where}"
                  + (f": {r['error']}" if r["error"] else ""))
    what = {"compile": f"compiled for sm_90: {compiled} distinct kernels from {launches} launches",
            "gpu": "against float64 on the GPU",
            "smoke": "against float64 in Triton's interpreter"}[which]
    summary = {"mode": which, "cases": len(items), "rows": len(rows), "failed": len(failed),
               "distinct_compiles": compiled, "launches": launches,
               "seconds": round(seconds, 1), "jobs": args.jobs}
    print(f"{len(rows) - len(failed)}/{len(rows)} rows passed, {len(items)} cases ({what}) "
          f"in {seconds:.0f} s")
    if args.out:
        write(args.out, rows, summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
