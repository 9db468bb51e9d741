"""PyTorch references for the mLSTM (mLSTMsig and mLSTMexp): the ground truth.

- :func:`mlstm_recurrent`: the step-by-step recurrence (docs/tfla-kernels.md 2.2)
- :func:`mlstm_parallel`: the fully parallel stabilised form (2.3)
- :func:`mlstm_chunkwise`: the chunkwise form every kernel implements (2.4)

All take ``(q, k, v, i, f, *, variant="sig"|"exp", normalize, eps, initial_state,
return_last_state, detach_normalizer)`` (chunkwise also ``chunk_size``), any floating
dtype and device, and are differentiable with torch autograd; with
``detach_normalizer=True`` (default) their gradients are the kernels' convention
(docs/tfla-kernels.md 1.5).
"""

from tfla.reference.chunkwise import mlstm_chunkwise
from tfla.reference.parallel import mlstm_parallel
from tfla.reference.recurrent import mlstm_recurrent

__all__ = ["mlstm_recurrent", "mlstm_parallel", "mlstm_chunkwise"]
