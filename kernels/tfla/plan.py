"""``chunk_size="auto"``: which chunk size and algorithm a call of mlstm_sig / mlstm_exp runs.

The rule is measured on one NVIDIA H200 (docs/kernels.md, "Tuning rules", rows C1-C2); it
depends on the variant, the mode (gradients needed or not), the head dimensions and the
dtype, and for mLSTMsig's forward walk on the grid (batch x heads against the SM count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Plan", "plan", "ALGORITHMS"]

#: what ``Plan.algorithm`` can name: the paper's two-level TFLA kernels (``xl_chunk``), the
#: forward walk of mLSTMsig (chunk states on chip, no gradients), the walk over sequence
#: segments (where the grid is small: a pass over K and V gives each segment's start
#: state), the walk (whole or in segments) as the forward of a call with gradients (it
#: stores the chunk states of L) before the two-level backward, the one-level limit_chunk
#: kernels, and the PyTorch chunkwise reference (CPU tensors outside Triton's interpreter)
ALGORITHMS = ("two_level", "walk", "walk_segments", "walk_two_level",
              "walk_segments_two_level", "limit_chunk", "reference")


@dataclass(frozen=True)
class Plan:
    """What one call runs, as :func:`plan` decides it and ``mlstm_sig`` / ``mlstm_exp``
    execute it (the one dispatcher: docs/kernels.md, "Dispatch").

    Fields compared (``==``): ``chunk_size`` L (the size run, clamped to the sequence; for
    the ``*_two_level`` walks the backward's), ``algorithm`` (one of :data:`ALGORITHMS`),
    ``segments`` (the walk's sequence segments; 1 otherwise). Descriptive, not compared:
    ``walk_chunk`` (the walk's L; 0 without the walk), ``kernels`` (the kernel modules the
    call launches, by name, ``tfla.triton.<name>``, forward then backward), ``fused_bw``
    (the backward runs one program per chunk: limit_chunk, or rule B-FUSED's tuning) and
    ``walk`` (the walk's launch configuration, as ``sig_walk_fw.walk_config`` gives it).
    """

    chunk_size: int
    algorithm: str
    segments: int = 1
    walk_chunk: int = field(default=0, compare=False)
    kernels: tuple = field(default=(), compare=False)
    fused_bw: bool = field(default=False, compare=False)
    walk: tuple = field(default=(), compare=False, repr=False)


#: the chunk size at which ``chunk_size="auto"`` first tries mLSTMsig's forward walk
WALK_CHUNK = 64


def auto_chunk(variant: str, *, d_qk: int, d_hv: int, grad: bool, dtype=None) -> int:
    """The chunk size L of the two-level kernels under ``chunk_size="auto"``, before
    clamping to S.

    Rule (docs/kernels.md, Tuning rules C1-C2): the two-level kernels run at L 128 in
    every mode, variant, head size and dtype but one: mLSTMsig in 16-bit at d_qk 256 /
    d_hv 512 exactly (Figure 5's heads) runs at L 256, whose tiles (H7, B10, B11) made it
    faster forward and forward+backward at a third less peak memory (half the chunk
    states). Head dimensions that pad up to those tiles (192 / 384) ran 9-20 % slower at
    L 256 than at L 128 (suites/chunk_rule_heldout.yaml), so the padding does not count. With gradients, mLSTMsig at d_qk <= 128 ran fwd+bwd
    about 7-12 % faster at L 64 but needed about 1.6x the peak memory (twice the chunk
    states kept for the backward), so L 64 is not taken there; mLSTMsig first tries the
    forward walk at L :data:`WALK_CHUNK` (with gradients as the forward of the backward at
    L 128, storing its chunk states; :func:`plan` says whether it takes the call).
    ``variant``, ``d_qk``, ``d_hv``, ``grad`` and ``dtype`` are the rule's inputs.
    """
    import torch

    if variant == "sig" and dtype in (torch.bfloat16, torch.float16) and (d_qk, d_hv) == (256, 512):
        return 256
    return 128


def plan(variant: str, q, v, *, chunk_size="auto", algorithm: str = "xl_chunk",
         grad: bool | None = None, normalize: bool = False,
         return_last_state: bool = False, batch_heads: int | None = None,
         device=None) -> Plan:
    """The plan that ``mlstm_sig`` (``variant="sig"``) or ``mlstm_exp`` (``"exp"``) runs for
    these arguments, without running it: the same function (:func:`plan_of`) decides for
    the calls themselves.

    Args:
        variant: "sig" or "exp".
        q: a (B, NH, S, d_qk) tensor, or anything with ``.shape``, ``.dtype`` and ``.device``
            (e.g. ``torch.empty(..., device="meta")``: nothing is read).
        v: (B, NH, S, d_hv), likewise.
        chunk_size: an int (a power of two >= 16) or "auto".
        algorithm: "xl_chunk" or "limit_chunk", as the public functions take it.
        grad: whether gradients will be needed; None reads it from ``q.requires_grad`` and
            torch's grad mode.
        normalize, return_last_state: as the public functions take them (mLSTMsig's walk
            runs only without the normaliser).
        batch_heads: B·NH if it differs from q's (default: from q.shape).
        device: the torch.device the call runs on, if not q's (e.g. for a "meta" q).

    Returns:
        :class:`Plan`. For the ``*_two_level`` walks chunk_size is the backward's L (the
        walk runs at :data:`WALK_CHUNK` and stores the states of L).

    Raises:
        ValueError: an unknown variant or algorithm, or a chunk_size neither "auto" nor a
            power of two >= 16.
    """
    import torch

    from tfla.triton import common
    from tfla.triton.tuning import tuning_key

    B, NH, S, d_qk = q.shape
    if grad is None:
        grad = torch.is_grad_enabled() and bool(getattr(q, "requires_grad", False))
    device = torch.device(device) if device is not None else q.device
    bnh = batch_heads if batch_heads is not None else B * NH
    kernels_run = device.type == "cuda" or common.interpret_mode()
    return plan_of(variant, bnh, S, d_qk, v.shape[-1], q.dtype, device, chunk_size, algorithm,
                   bool(grad), normalize, return_last_state, tuning_key(), kernels_run)


#: every plan made, by the arguments of :func:`plan_of` (plain values: a call's plan is
#: one dictionary look-up after the first call of its shape)
_PLANS: dict = {}


def plan_of(variant: str, batch_heads: int, S: int, d_qk: int, d_hv: int, dtype, device,
            chunk_size, algorithm: str, grad: bool, normalize: bool, return_last_state: bool,
            tuning: int, kernels_run: bool) -> Plan:
    """:func:`plan` from plain values: B·NH, S, the head dimensions, q's dtype, the
    torch.device, ``chunk_size`` (an int or "auto"), ``tuning`` (a
    :func:`tfla.triton.tuning.tuning_key`) and ``kernels_run`` (False: CPU tensors outside
    Triton's interpreter, the PyTorch reference runs). Worked out once per distinct
    arguments, then cached; the registered operators (``tfla.ops``) call it inside the
    operator, so a traced program sees none of its branching.

    Raises:
        ValueError: as :func:`plan`.
    """
    key = (variant, batch_heads, S, d_qk, d_hv, dtype, device, chunk_size, algorithm, grad,
           normalize, return_last_state, tuning, kernels_run)
    found = _PLANS.get(key)
    if found is None or found[0] != _interpreting():
        found = _PLANS[key] = (_interpreting(), _decide(*key))
    return found[1]


def _interpreting() -> bool:
    """Triton's interpreter switch now (the kernels' operand dtype depends on it: a plan
    made under the other setting is made again)."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def _decide(variant, bnh, S, d_qk, d_hv, dtype, device, chunk_size, algorithm, grad,
            normalize, return_last_state, tuning_key, kernels_run) -> Plan:
    """The branching of :func:`plan_of` (docs/kernels.md, "Tuning rules" C1-C2, W1-W6)."""
    import torch

    from tfla.checks import check_choice
    from tfla.triton.tuning import tuning_of

    check_choice("variant", variant, ("sig", "exp"))
    check_choice("algorithm", algorithm, ("xl_chunk", "limit_chunk"))
    L = resolve_chunk(chunk_size, variant, d_qk=d_qk, d_hv=d_hv, grad=grad, dtype=dtype,
                      algorithm=algorithm)
    if not kernels_run:
        return Plan(L, "reference")
    import triton

    from tfla.triton.chunkwise import MODULE_NAMES as NAMES
    from tfla.triton.chunkwise import effective_chunk, kernels, train_walk_config
    from tfla.triton.common import num_sms

    tuning = tuning_of(tuning_key)
    mods = kernels()
    auto = chunk_size == "auto"
    # the kernels' dtype: float32 copies of bfloat16 in Triton's interpreter (_dot_operands)
    k_dtype = (torch.float32 if dtype == torch.bfloat16 and triton.knobs.runtime.interpret
               else dtype)
    two_level_fw = (NAMES["recurrent"], NAMES["parallel_fw"])

    def backward(L_bw: int, limit: bool):
        if not grad:
            return {}
        fused = limit or mods.parallel_bw.fused_bw(L_bw, d_qk, d_hv, k_dtype, tuning)
        bw = NAMES["limit_bw"] if fused else NAMES["parallel_bw"]
        return {"fused_bw": fused, "bw": (NAMES["recurrent"], bw)}

    def make(L_run, algo, fw, segments=1, walk=None, walk_chunk=0, L_bw=None):
        bw = backward(L_bw or L_run, algo == "limit_chunk")
        return Plan(L_run, algo, segments, walk_chunk=walk_chunk, kernels=fw + bw.get("bw", ()),
                    fused_bw=bw.get("fused_bw", False),
                    walk=tuple(sorted((walk or {}).items())))

    if algorithm == "limit_chunk":
        return make(effective_chunk(S, L), "limit_chunk", two_level_fw)
    walk_fw = (NAMES["sig_walk_fw"],)
    if variant == "sig" and grad and not normalize and auto:
        L_bw = effective_chunk(S, L)
        walk = train_walk_config(S, L_bw, WALK_CHUNK, d_qk, d_hv, bnh, dtype, device,
                                 return_last_state, tuning)
        if walk is not None:
            algo = "walk_segments_two_level" if walk["segments"] > 1 else "walk_two_level"
            return make(L_bw, algo, (NAMES["recurrent"],) + walk_fw, walk["segments"], walk,
                        walk["L"])
    if variant == "sig" and not (grad or normalize):
        L_walk = effective_chunk(S, WALK_CHUNK if auto else L)
        walk = mods.sig_walk_fw.walk_config(L_walk, d_qk, d_hv, bnh, dtype, num_sms(device),
                                            return_last_state, tuning, S=S)
        if walk is not None:
            algo = "walk_segments" if walk["segments"] > 1 else "walk"
            return make(L_walk, algo, walk_fw, walk["segments"], walk, L_walk)
    return make(effective_chunk(S, L), "two_level", two_level_fw)


def resolve_chunk(chunk_size, variant: str, *, d_qk: int, d_hv: int, grad: bool, dtype,
                  algorithm: str = "xl_chunk") -> int:
    """chunk_size as given (validated) or, for "auto", :func:`auto_chunk`'s (limit_chunk:
    64, its default)."""
    from tfla.checks import check_chunk_size

    if chunk_size == "auto":
        if algorithm == "limit_chunk":
            return 64
        return auto_chunk(variant, d_qk=d_qk, d_hv=d_hv, grad=grad, dtype=dtype)
    return check_chunk_size(chunk_size, minimum=16, power_of_two=True)
