"""tflabench: kernel benchmarking and roofline analysis around Tiled Flash Linear Attention.

Import-light on purpose: the analytic commands must start without torch.
"""

__version__ = "0.1.0"
