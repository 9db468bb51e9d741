"""Triton kernels of tfla, one module per kernel of the paper's Table 1 (plus the recurrent
state kernels): mLSTMsig in ``sig_*`` (with ``common``), mLSTMexp in ``exp_*`` / ``limit_*``.

Modules are imported lazily by the public functions, so that importing ``tfla`` never
compiles anything, and so that ``TRITON_INTERPRET`` is read when a kernel module is first
imported (triton decides between compiling and interpreting at decoration time).
"""
