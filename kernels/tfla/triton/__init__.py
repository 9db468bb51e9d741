"""Triton kernels of tfla, one module per kernel of the paper's Table 1 (plus the recurrent
state kernels). The TFLA kernels of both variants (IS_EXP a constexpr) in ``chunkwise*``
(host side and autograd in ``chunkwise``) and ``limit_parallel_bw``; shared helpers (tile
access, launch, interpreter workaround) in ``common``.

Modules are imported lazily by the public functions, so that importing ``tfla`` never
compiles anything, and so that ``TRITON_INTERPRET`` is read when a kernel module is first
imported (triton decides between compiling and interpreting at decoration time).
"""
