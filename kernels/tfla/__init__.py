"""tfla: Tiled Flash Linear Attention (TFLA) kernels for the mLSTM, in Triton.

Public functions (paper: Beck, Poeppel, Lippe, Hochreiter, "Tiled Flash Linear
Attention", NeurIPS 2025):

- :func:`mlstm_sig`: mLSTM with sigmoid input gate (mLSTMsig), ``xl_chunk`` / ``limit_chunk``
- :func:`mlstm_exp`: mLSTM with exponential input gate (mLSTMexp), ``xl_chunk`` / ``limit_chunk``
- :func:`plan`: the chunk size and algorithm a call runs (``chunk_size="auto"``'s rule)

PyTorch ground truth lives in :mod:`tfla.reference`.
"""

__version__ = "0.1.0"

from tfla.mlstm_sig import mlstm_sig  # noqa: E402
from tfla.mlstm_exp import mlstm_exp  # noqa: E402
from tfla.plan import Plan, plan  # noqa: E402

__all__ = ["mlstm_sig", "mlstm_exp", "plan", "Plan", "__version__"]
