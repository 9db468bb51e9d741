"""``chunk_size="auto"``: which chunk size and algorithm a call of mlstm_sig / mlstm_exp runs.

The rule is measured on one NVIDIA H200 (docs/kernels.md, "Tuning rules", rows C1-C2); it
depends on the variant, the mode (gradients needed or not), the head dimensions and the
dtype, and for mLSTMsig's forward walk on the grid (batch x heads against the SM count).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """What one call runs: ``chunk_size`` L (the size actually used, after clamping to the
    sequence), ``algorithm`` (one of :data:`ALGORITHMS`) and, for the ``walk_segments``
    algorithms, the number of sequence segments (1 otherwise)."""

    chunk_size: int
    algorithm: str
    segments: int = 1


#: the chunk size at which ``chunk_size="auto"`` first tries mLSTMsig's forward walk
WALK_CHUNK = 64


def auto_chunk(variant: str, *, d_qk: int, d_hv: int, grad: bool, dtype=None) -> int:
    """The chunk size L of the two-level kernels under ``chunk_size="auto"``, before
    clamping to S.

    Rule (docs/kernels.md, Tuning rules C1-C2): the two-level kernels run at L 128 in
    every mode, variant, head size and dtype but one: mLSTMsig in 16-bit at d_qk 256 /
    d_hv 512 (Figure 5's heads; each rounded up to a power of two) runs at L 256, whose
    tiles (H7, B10, B11) made it faster forward and forward+backward at a third less peak
    memory (half the chunk states). With gradients, mLSTMsig at d_qk <= 128 ran fwd+bwd
    about 7-12 % faster at L 64 but needed about 1.6x the peak memory (twice the chunk
    states kept for the backward), so L 64 is not taken there; mLSTMsig first tries the
    forward walk at L :data:`WALK_CHUNK` (with gradients as the forward of the backward at
    L 128, storing its chunk states; :func:`plan` says whether it takes the call).
    ``variant``, ``d_qk``, ``d_hv``, ``grad`` and ``dtype`` are the rule's inputs.
    """
    import torch

    from tfla.triton.common import pow2

    if (variant == "sig" and dtype in (torch.bfloat16, torch.float16)
            and (pow2(d_qk), pow2(d_hv)) == (256, 512)):
        return 256
    return 128


def plan(variant: str, q, v, *, chunk_size="auto", algorithm: str = "xl_chunk",
         grad: bool | None = None, normalize: bool = False,
         return_last_state: bool = False, batch_heads: int | None = None,
         device=None) -> Plan:
    """The chunk size and algorithm that ``mlstm_sig`` (``variant="sig"``) or ``mlstm_exp``
    (``"exp"``) runs for these arguments, without running it.

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
        :class:`Plan` (chunk_size: int, algorithm: str, segments: int). For the
        ``*_two_level`` walks chunk_size is the backward's L (the walk runs at
        :data:`WALK_CHUNK` and stores the states of L).

    Raises:
        ValueError: an unknown variant or algorithm, or a chunk_size neither "auto" nor a
            power of two >= 16.
    """
    import torch

    from tfla.checks import check_choice

    check_choice("variant", variant, ("sig", "exp"))
    check_choice("algorithm", algorithm, ("xl_chunk", "limit_chunk"))
    B, NH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    if grad is None:
        grad = torch.is_grad_enabled() and bool(getattr(q, "requires_grad", False))
    L = resolve_chunk(chunk_size, variant, d_qk=d_qk, d_hv=d_hv, grad=grad, dtype=q.dtype,
                      algorithm=algorithm)
    from tfla.triton.common import interpret_mode

    device = torch.device(device) if device is not None else q.device
    if device.type != "cuda" and not interpret_mode():
        return Plan(L, "reference")
    from tfla.triton.chunkwise import effective_chunk

    if algorithm == "limit_chunk":
        return Plan(effective_chunk(S, L), "limit_chunk")

    bnh = batch_heads if batch_heads is not None else B * NH
    if variant == "sig" and grad and not normalize and chunk_size == "auto":
        from tfla.triton.chunkwise import train_walk_config
        from tfla.triton.tuning import active_tuning

        L_bw = effective_chunk(S, L)
        walk = train_walk_config(S, L_bw, WALK_CHUNK, d_qk, d_hv, bnh, q.dtype, device,
                                 return_last_state, active_tuning())
        if walk is not None:
            if walk["segments"] > 1:
                return Plan(L_bw, "walk_segments_two_level", walk["segments"])
            return Plan(L_bw, "walk_two_level")
    if variant == "sig" and not (grad or normalize):
        from tfla.triton.chunkwise import kernels
        from tfla.triton.common import num_sms
        from tfla.triton.tuning import active_tuning

        walk = kernels()[4]
        L_walk = effective_chunk(S, WALK_CHUNK if chunk_size == "auto" else L)
        cfg = walk.walk_config(L_walk, d_qk, d_hv, bnh, q.dtype, num_sms(device),
                               return_last_state, active_tuning(), S=S)
        if cfg is not None:
            if cfg["segments"] > 1:
                return Plan(L_walk, "walk_segments", cfg["segments"])
            return Plan(L_walk, "walk")
    return Plan(effective_chunk(S, L), "two_level")


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
