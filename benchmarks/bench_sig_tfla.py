"""GPU benchmark of our mLSTMsig xl_chunk (impl "sig": ``tfla.mlstm_sig``, which runs
the forward walk where its rule takes the call, else the paper's two-level TFLA kernels shared
with mLSTMexp; the variant "no_walk" forces the latter; "sig_last" also returns the last
state) beside our mLSTMexp xl_chunk, the
authors' mlstm_kernels mLSTMsig xl_chunk and FLA chunk_simple_gla, over chunk sizes. (Rows of
runs 1-9 name the impl "sig_tiled", and runs 1-4 "sig_walk" for the walk of versions 0-4.)

Shapes (the tables of docs/kernels.md's tuning rules; bf16):
  fig4   B 8, 16 heads, d_qk 128, d_hv 256, S 8192   (Figure 4's head shape)
  b7     B 8,  8 heads, d_qk 256, d_hv 512, S 8192   (xLSTM-7B heads = Figure 5's shape)
  small  B 16, 32 heads, d_qk 64, d_hv 128, S 4096
Method as the issue's table: inputs without grad for "fwd" (with grad and a ones dh for
"fwdbw", gradients set to None before each call), median of 20 timed calls after 5
warm-ups (tflabench.run.measure.time_callable: CUDA events, calls back to back), peak memory =
torch.cuda.max_memory_allocated during one call minus what was allocated before it; all in
one process, peers in the same process. Compile/autotune is the untimed first call.

``--root`` measures another checkout's kernels (one process per checkout, the same script),
``--tag`` names it in the rows; ``--profile fig4:128,...`` adds each kernel's CUDA time in one
fwd+bwd call (torch.profiler) as rows ``prof:<kernel>``.

Tuning variants (``--variants``) run one measurement under a ``tfla.triton.tuning.Tuning``
(``use_tuning``; docs/kernels.md, "Overriding the rules"); a forward variant's row also gives
max |Δh| against the default configuration (diff_vs_default).
``--breakdown`` times the tiled forward's three launches (gates, recurrent, H) apart.

    python3 benchmarks/bench_sig_tfla.py --out DIR [--shapes fig4,b7,small] [--chunks 64,128,256,512]
        [--impls sig,exp,peer,fla] [--modes fwd,fwdbw] [--variants] [--breakdown]
        [--sweep rec,fw --sweep-chunks 128,256] [--budget-s 500] [--smoke]

Writes rows.csv (one row per measurement, appended as it goes) under --out and prints a
table per shape. ``--smoke`` runs tiny shapes on the CPU through Triton's interpreter to
check this script's logic (times there mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
import time
import traceback

SHAPES = {
    "fig4": dict(B=8, NH=16, d_qk=128, d_hv=256, S=8192),
    "b7": dict(B=8, NH=8, d_qk=256, d_hv=512, S=8192),
    "small": dict(B=16, NH=32, d_qk=64, d_hv=128, S=4096),
    # Figure 4's two longest sequences (fixed tokens: B·S = 65536): grids of 32 and 16 heads
    "fig4_s32k": dict(B=2, NH=16, d_qk=128, d_hv=256, S=32768),
    "fig4_s64k": dict(B=1, NH=16, d_qk=128, d_hv=256, S=65536),
    # other heads where dK and dV are separate programs (B4 does not apply)
    "h128x128": dict(B=8, NH=16, d_qk=128, d_hv=128, S=8192),
    "h256x256": dict(B=8, NH=8, d_qk=256, d_hv=256, S=8192),
    "h64x256": dict(B=8, NH=16, d_qk=64, d_hv=256, S=8192),
    # Figure 4's sweep (B·S = 65536, 16 heads, 128 / 256): fig4_S<S>
    **{f"fig4_S{S}": dict(B=65536 // S, NH=16, d_qk=128, d_hv=256, S=S)
       for S in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)},
    # the held-out heads where FLA's simple GLA is the forward to match (chunk_rule_heldout)
    "h192_S512": dict(B=128, NH=8, d_qk=192, d_hv=384, S=512),
    "h192_S1024": dict(B=64, NH=8, d_qk=192, d_hv=384, S=1024),
}
SMOKE_SHAPES = {"tiny": dict(B=1, NH=2, d_qk=16, d_hv=32, S=100)}

#: tuning variants: name -> the fields of a tfla.triton.tuning.Tuning (family -> overrides)
VARIANTS = {
    "fw_q128": {"fw": {"B_LQ": 128, "B_LKV": 64, "num_warps": 8}},
    "fw_dhv64": {"fw": {"B_DHV": 64}},
    "fw_dhv256_w8": {"fw": {"B_DHV": 256, "num_warps": 8}},
    "fw_w8": {"fw": {"num_warps": 8}},
    "fw_st3": {"fw": {"num_stages": 3}},
    "fw_kv32": {"fw": {"B_LKV": 32}},
    "rec_64x64": {"state": {"B_DQK": 64, "B_DHV": 64}},
    "rec_st2": {"state": {"num_stages": 2}},
    "rec_acc_in_c": {"state": {"ACC_IN_C": True}},
    # TMA tiles (both forward kernels) and V-side gate scaling (state kernel) are the 16-bit
    # default (docs/kernels.md, rule S3); these switch them off again, one by one, against
    # the current defaults:
    "rec_scale_k": {"state": {"SCALE_V": False}},
    "rec_ptr": {"state": {"USE_TMA": False}},
    "fw_ptr": {"fw": {"USE_TMA": False}},
    "ptr_scale_k": {"fw": {"USE_TMA": False}, "state": {"USE_TMA": False, "SCALE_V": False}},  # neither (S3 off)
    # rule H5: the inter-chunk product Q̄ C_{k-1} inside the key/value loop, one d_qk slice
    # of C_{k-1} per iteration, so that its loads are pipelined with K and V instead of
    # waited for before the loop (chunkwise_parallel_fw.inter_slice)
    "fw_iil": {"fw": {"INTER_IN_LOOP": True}},
    "fw_no_iil": {"fw": {"INTER_IN_LOOP": False}},   # the default outside rule H5's shapes
    "fw_iil_st3": {"fw": {"INTER_IN_LOOP": True, "num_stages": 3}},
    "fw_iil_kv32_st3": {"fw": {"INTER_IN_LOOP": True, "B_LKV": 32, "num_stages": 3}},
    "fw_kv32_st3": {"fw": {"B_LKV": 32, "num_stages": 3}},
    # the forward walk (Tuning.walk) at L 64 (rules W1-W5)
    "no_walk": {"walk": {"enabled": False}},
    "walk_dhv64": {"walk": {"B_DHV": 64}},
    "walk_dhv128": {"walk": {"B_DHV": 128}},
    "walk_st3": {"walk": {"num_stages": 3}},
    "walk_w8": {"walk": {"num_warps": 8}},
    "walk_st1": {"walk": {"num_stages": 1}},
    "walk_mr168_st1": {"walk": {"maxnreg": 168, "num_stages": 1}},
    "walk_mr128_st1": {"walk": {"maxnreg": 128, "num_stages": 1}},
    "walk_any_grid": {"walk": {"MIN_PROGRAMS_PER_SM": 0}},
    # the walk over G sequence segments whatever the grid (rule W7; seg1: the whole walk)
    **{f"walk_seg{n}": {"walk": {"SEGMENTS": n}} for n in (1, 2, 4, 8, 16)},
    # the segment-state pass (rule W8): sub-segments per segment, its d_hv block
    **{f"seg_split{n}": {"walk": {"SEGMENT_SPLIT": n}} for n in (1, 2, 4, 8)},
    **{f"seg_dhv128_split{n}": {"walk": {"SEGMENT_B_DHV": 128, "SEGMENT_SPLIT": n}}
       for n in (2, 4, 8)},
    # the segment-state pass's pipeline stages (default 4, rule W8), with d_hv
    # blocks of 128
    **{f"seg_st{n}": {"walk": {"SEGMENT_STAGES": n}} for n in (2, 4)},
    "seg_dhv128_st3": {"walk": {"SEGMENT_B_DHV": 128, "SEGMENT_STAGES": 3}},
    # dQ's pipeline stages beside the segment-state pass's
    "bw_dq_st4": {"bw": {"num_stages": 4}},
    "bw_dq_st3_seg_st4": {"bw": {"num_stages": 3}, "walk": {"SEGMENT_STAGES": 4}},
    "bw_dq_st3_seg_dhv128": {"bw": {"num_stages": 3}, "walk": {"SEGMENT_B_DHV": 128}},
    "bw_dq_st2": {"bw": {"num_stages": 2}},
    "seg_dhv128_st4": {"walk": {"SEGMENT_B_DHV": 128, "SEGMENT_STAGES": 4}},
    "seg_dhv32_st3": {"walk": {"SEGMENT_B_DHV": 32, "SEGMENT_STAGES": 3}},
    "bw_dq_dhv128": {"bw": {"B_DHV": 128}},
    # the state-gradient kernel's grid bound (state_blocks' MIN_PROGRAMS; default half the SMs)
    **{f"bwrec_min{n}": {"state": {"MIN_PROGRAMS": n}} for n in (132, 264, 528)},
    # the walk as the forward of fwd+bwd under "auto" (impl sig_auto; rule W6) off: the
    # two-level forward at L 128
    "no_train_walk": {"walk": {"train": False}},
    # register caps (walk_config caps d_qk > 64 at 240 without the last state; runs 15-17)
    "walk_uncapped": {"walk": {"maxnreg": None}},
    **{f"walk_mr{r}": {"walk": {"maxnreg": r}} for r in (168, 184, 200, 216, 224, 232, 240, 248)},
    # backward (fwd+bwd rows): TMA tiles in the state-gradient kernel (bwrec_*, with the row
    # scale on dH: _sdh) and in dQ / dK / dV (bwpar_tma); tiles, warps, stages
    "bw_tma": {"bw": {"USE_TMA": True}, "state_bw": {"USE_TMA": True, "SCALE_DH": True}},
    "bwrec_tma": {"state_bw": {"USE_TMA": True}},
    "bwrec_tma_sdh": {"state_bw": {"USE_TMA": True, "SCALE_DH": True}},
    "bwpar_tma": {"bw": {"USE_TMA": True}},
    "bw_w8": {"bw": {"num_warps": 8}},
    "bw_st3": {"bw": {"num_stages": 3}},
    "bw_lkv32": {"bw": {"B_LKV": 32}},
    "bw_dhv64": {"bw": {"B_DHV": 64}},
    "bwrec_64x64": {"state_bw": {"B_DQK": 64, "B_DHV": 64}},
    "bwrec_st2": {"state_bw": {"num_stages": 2}},
    # the state-gradient kernel's blocks where the grid is small (Figure 4's heads at S 65536:
    # 64 x 64 by state_blocks' bound), larger blocks and fewer programs beside dQ
    "bwrec_64x128_w8": {"state_bw": {"B_DQK": 64, "B_DHV": 128, "num_warps": 8}},
    "bwrec_64x128_w4": {"state_bw": {"B_DQK": 64, "B_DHV": 128, "num_warps": 4}},
    "bwrec_128x64_w8": {"state_bw": {"B_DQK": 128, "B_DHV": 64, "num_warps": 8}},
    "bwrec_128x128_w8": {"state_bw": {"B_DQK": 128, "B_DHV": 128, "num_warps": 8}},
    "bwrec_64x64_w2": {"state_bw": {"num_warps": 2}},
    **{f"bwrec_64x128_w8_st{n}": {"state_bw": {"B_DQK": 64, "B_DHV": 128, "num_warps": 8,
                                               "num_stages": n}} for n in (2, 4)},
    "bwrec_64x256_w8": {"state_bw": {"B_DQK": 64, "B_DHV": 256, "num_warps": 8}},
    # dQ, dK, dV of a chunk in one program (limit_parallel_bw) with TMA state-gradient tiles
    **{f"bw_fused{n}": {"bw": {"FUSED": True}, "limit_bw": lim,
                        "state_bw": {"USE_TMA": True, "SCALE_DH": True}}
       for n, lim in (("", {}), ("_q128", {"B_DQK": 128}),
                      ("_q128_w8", {"B_DQK": 128, "num_warps": 8}),
                      ("_w8", {"num_warps": 8}), ("_st2", {"num_stages": 2}),
                      ("_v128_w8", {"B_DHV": 128, "num_warps": 8}))},
    # dK and dV of a key/value tile in one program (chunkwise_parallel_bw._dkv_fused_kernel):
    # on and off against the default, query tile 32 or 64, warps, stages
    "bw_fdkv": {"bw": {"FUSED_DKV": True}},
    "bw_no_fdkv": {"bw": {"FUSED_DKV": False}},
    "bw_fdkv_q64": {"bw": {"FUSED_DKV": True, "DKV_B_LQ": 64}},
    "bw_fdkv_w4": {"bw": {"FUSED_DKV": True, "DKV_num_warps": 4}},
    "bw_fdkv_st1": {"bw": {"FUSED_DKV": True, "DKV_num_stages": 1}},
    # query/key tiles and warps of the one-launch kernel at L 64 and 128 (rule B4)
    **{f"bw_fdkv_{n}": {"bw": {"FUSED_DKV": True, **o}} for n, o in (
        ("q64_w8", {"DKV_B_LQ": 64, "DKV_num_warps": 8}),
        ("q32_w8", {"DKV_B_LQ": 32, "DKV_num_warps": 8}),
        ("q32_w8_st1", {"DKV_B_LQ": 32, "DKV_num_warps": 8, "DKV_num_stages": 1}),
        ("q64_w4", {"DKV_B_LQ": 64, "DKV_num_warps": 4}),
        ("q32_w4", {"DKV_B_LQ": 32, "DKV_num_warps": 4}),
        ("q32_kv32_w4", {"DKV_B_LQ": 32, "DKV_B_LKV": 32, "DKV_num_warps": 4}))},
    "bw_dq_w8": {"bw": {"num_warps": 8}},
    # where dK and dV run as one launch, the bw tiles, warps and stages act on dQ alone; the
    # one-launch kernel's stages; the state-gradient kernel's warps and stages
    "bw_dq_st3": {"bw": {"num_stages": 3}},
    "bw_dq_st1": {"bw": {"num_stages": 1}},
    "bw_dq_kv32": {"bw": {"B_LKV": 32}},
    "bw_dq_dhv64": {"bw": {"B_DHV": 64}},
    "bw_fdkv_st3": {"bw": {"DKV_num_stages": 3}},
    "bw_dq_st1_dhv64": {"bw": {"num_stages": 1, "B_DHV": 64}},
    "bw_dq_dhv64_fdkv_st3": {"bw": {"B_DHV": 64, "DKV_num_stages": 3}},
    "bw_dq_st1_fdkv_st3": {"bw": {"num_stages": 1, "DKV_num_stages": 3}},
    "bw_dq_st1_dhv64_fdkv_st3": {"bw": {"num_stages": 1, "B_DHV": 64, "DKV_num_stages": 3}},
    "bwrec_w4": {"state_bw": {"num_warps": 4}},
    "bwrec_w8": {"state_bw": {"num_warps": 8}},
    "bwrec_st4": {"state_bw": {"num_stages": 4}},
    # dQ with query tiles of 128 rows (one per chunk at L 128: C_{k-1} read once per chunk
    # instead of once per 64-row tile); key tiles, warps, stages, d_hv block
    **{f"bw_dq_{n}": {"bw": {"B_LQ": 128, **o}} for n, o in (
        ("q128_w8", {"num_warps": 8}),
        ("q128_w4", {"num_warps": 4}),
        ("q128_w8_st3", {"num_warps": 8, "num_stages": 3}),
        ("q128_kv32_w8", {"B_LKV": 32, "num_warps": 8}),
        ("q128_dhv64_w8", {"B_DHV": 64, "num_warps": 8}))},
    # dK and dV with each tile's products formed once (rule B10) on and off
    "bw_once": {"bw": {"ONCE_DKV": True}},
    "bw_no_once": {"bw": {"ONCE_DKV": False}},
    "bw_once_w8": {"bw": {"ONCE_DKV": True, "num_warps": 8}},
    **{f"bw_once_{n}": {"bw": dict(o, ONCE_DKV=True)} for n, o in (
        ("v256_w8", {"B_DHV": 256, "num_warps": 8}),
        ("q256", {"B_DQK": 256}),
        ("q256_w8", {"B_DQK": 256, "num_warps": 8}),
        ("st3", {"num_stages": 3}),
        ("st1", {"num_stages": 1}),
        ("kv32", {"B_LKV": 32}),
        ("dkvst3", {"DKV_num_stages": 3}),
        ("dkvst2", {"DKV_num_stages": 2}),
        ("dkvst4", {"DKV_num_stages": 4}))},
    # the once kernel's own row tiles and warps (DKV_*; dQ keeps the bw tiles): 128-row key
    # tiles read the chunk's dC_k, K and V once per role instead of once per 64-row tile
    **{f"bw_once_{n}": {"bw": o} for n, o in (
        ("kv128_w8", {"DKV_B_LKV": 128, "DKV_num_warps": 8}),
        ("kv128_w8_st2", {"DKV_B_LKV": 128, "DKV_num_warps": 8, "DKV_num_stages": 2}),
        ("kv128_q128_w8", {"DKV_B_LKV": 128, "DKV_B_LQ": 128, "DKV_num_warps": 8}),
        ("kv128_q128_w8_st2", {"DKV_B_LKV": 128, "DKV_B_LQ": 128, "DKV_num_warps": 8,
                               "DKV_num_stages": 2}),
        ("dkvw8", {"DKV_num_warps": 8}),
        ("q128", {"DKV_B_LQ": 128}),
        ("q128_w8", {"DKV_B_LQ": 128, "DKV_num_warps": 8}))},
    # with those 128-row dK/dV tiles (K): dQ as one program per query tile forming its
    # products once (ONCE_DQ) at its tiles, and the once kernel's head-dimension blocks
    **{f"bw_k{n}": {"bw": dict(o, DKV_B_LKV=128, DKV_B_LQ=128, DKV_num_warps=8)} for n, o in (
        ("", {}),
        ("_dqonce", {"ONCE_DQ": True}),
        ("_dqonce_st3", {"ONCE_DQ": True, "num_stages": 3}),
        ("_dqonce_q128_w8", {"ONCE_DQ": True, "B_LQ": 128, "num_warps": 8}),
        ("_dqonce_q128_w8_st3", {"ONCE_DQ": True, "B_LQ": 128, "num_warps": 8,
                                 "num_stages": 3}),
        ("_dqonce_q128_kv128_w8", {"ONCE_DQ": True, "B_LQ": 128, "B_LKV": 128,
                                   "num_warps": 8}),
        ("_v64", {"DKV_B_DHV": 64}),
        ("_v64_st4", {"DKV_B_DHV": 64, "DKV_num_stages": 4}),
        ("_q64", {"DKV_B_DQK": 64}),
        ("_q64_v64_st4", {"DKV_B_DQK": 64, "DKV_B_DHV": 64, "DKV_num_stages": 4}),
        ("_dq_st3", {"num_stages": 3}),
        ("_st4", {"DKV_num_stages": 4}),
        ("_v256", {"DKV_B_DHV": 256}),
        ("_q256", {"DKV_B_DQK": 256}),
        ("_v256_st2", {"DKV_B_DHV": 256, "DKV_num_stages": 2}),
        # smaller head blocks and fewer stages: two programs per SM by shared memory
        ("_q64_v64_st2", {"DKV_B_DQK": 64, "DKV_B_DHV": 64, "DKV_num_stages": 2}),
        ("_q64_v64_st3", {"DKV_B_DQK": 64, "DKV_B_DHV": 64, "DKV_num_stages": 3}),
        ("_q64_v64_st2_w4", {"DKV_B_DQK": 64, "DKV_B_DHV": 64, "DKV_num_stages": 2,
                             "DKV_num_warps": 4}),
        ("_v64_st2", {"DKV_B_DHV": 64, "DKV_num_stages": 2}),
        ("_q64_st2", {"DKV_B_DQK": 64, "DKV_num_stages": 2}),
        ("_dqonce_st4", {"ONCE_DQ": True, "num_stages": 4}),
        ("_dqonce_st3_w8", {"ONCE_DQ": True, "num_stages": 3, "num_warps": 8}),
        ("_dqonce_kv128_st3", {"ONCE_DQ": True, "B_LKV": 128, "num_stages": 3}),
        ("_dqonce_v64_st3", {"ONCE_DQ": True, "B_DHV": 64, "DKV_B_DHV": 128,
                             "num_stages": 3}),
        ("_dqonce_v64_st4", {"ONCE_DQ": True, "B_DHV": 64, "DKV_B_DHV": 128,
                             "num_stages": 4}))},
    # rules B10 and B11 at Figure 5's heads as before them (B10's 64-row tiles, 4 warps; dQ
    # per d_qk block in 2 stages), and each apart
    "bw_b10_64": {"bw": {"DKV_B_LQ": 64, "DKV_B_LKV": 64, "DKV_num_warps": 4,
                         "ONCE_DQ": False, "num_stages": 2}},
    "bw_no_once_dq": {"bw": {"ONCE_DQ": False, "num_stages": 2}},
    "bw_once_dq_st3": {"bw": {"ONCE_DQ": True, "num_stages": 3}},
    # where B4's one-program dK/dV kernel runs (Figure 4's and the small heads): B10's once
    # kernel instead, at its tiles, warps and stages
    **{f"bw_once_nf{n}": {"bw": dict(o, FUSED_DKV=False, ONCE_DKV=True)} for n, o in (
        ("_w4_st2", {"DKV_B_LQ": 64, "DKV_B_LKV": 64, "DKV_num_warps": 4, "DKV_num_stages": 2}),
        ("_w4_st3", {"DKV_B_LQ": 64, "DKV_B_LKV": 64, "DKV_num_warps": 4, "DKV_num_stages": 3}),
        ("_w8_st3", {"DKV_B_LQ": 64, "DKV_B_LKV": 64, "DKV_num_warps": 8, "DKV_num_stages": 3}),
        ("_128_w8", {"DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                     "DKV_num_stages": 2}),
        ("_128_w8_st3", {"DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                         "DKV_num_stages": 3}),
        ("_128_w8_st4", {"DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                         "DKV_num_stages": 4}))},
    # Figure 5's heads at L 256 (half the chunk states): the H kernel in 128-row query tiles
    # with the whole d_qk, and the backward's once kernels in 128-row tiles (two per chunk)
    **{f"l256_{n}": o for n, o in (
        ("a", {"fw": {"B_LQ": 128, "B_LKV": 64, "B_DQK": 256, "B_DHV": 128, "num_warps": 8},
               "bw": {"ONCE_DKV": True, "DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                      "DKV_num_stages": 2, "ONCE_DQ": True, "B_LQ": 128, "B_LKV": 128,
                      "num_warps": 8, "num_stages": 2}}),
        ("b", {"fw": {"B_LQ": 128, "B_LKV": 64, "B_DQK": 256, "B_DHV": 128, "num_warps": 8},
               "bw": {"ONCE_DKV": True, "DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                      "DKV_num_stages": 3, "ONCE_DQ": True, "B_LQ": 64, "B_LKV": 128,
                      "num_stages": 3}}),
        ("c", {"bw": {"ONCE_DKV": True, "DKV_B_LQ": 128, "DKV_B_LKV": 128, "DKV_num_warps": 8,
                      "DKV_num_stages": 3, "ONCE_DQ": True, "B_LQ": 64, "B_LKV": 128,
                      "num_stages": 3}}),
        ("d", {"fw": {"B_LQ": 128, "B_LKV": 64, "B_DQK": 256, "B_DHV": 128, "num_warps": 8}}),
        ("e", {"fw": {"B_LQ": 128, "B_LKV": 128, "B_DQK": 256, "B_DHV": 128, "num_warps": 8,
                      "num_stages": 1}}))},
    # the best H kernel of the L 256 sweep (128-row query, 64-row key tiles, whole d_qk,
    # d_hv blocks of 256, 8 warps) with the backward's once kernels at several tiles
    **{f"l256_{n}": {"fw": {"B_LQ": 128, "B_LKV": 64, "B_DQK": 256, "B_DHV": 256,
                             "num_warps": 8, "num_stages": 2},
                      "bw": dict({"ONCE_DKV": True, "DKV_B_LQ": 128, "DKV_B_LKV": 128,
                                  "DKV_num_warps": 8, "DKV_num_stages": 3, "ONCE_DQ": True,
                                  "B_LQ": 64, "B_LKV": 128, "num_stages": 3}, **o)}
       for n, o in (("f", {}), ("g", {"B_LQ": 128, "num_warps": 8}), ("i", {"num_stages": 2}),
                    ("j", {"DKV_num_stages": 2}), ("k", {"ONCE_DQ": False, "B_LKV": 64}))},
    # Figure 5's heads (256 / 512): wider head-dimension blocks (fewer dK / dV programs per
    # key/value tile, each forming K Qᵀ or V dH̃ᵀ once), 128-row key tiles, 32-row query tiles
    **{f"bw_{n}": {"bw": o} for n, o in (
        ("q256_w8", {"B_DQK": 256, "num_warps": 8}),
        ("q256", {"B_DQK": 256}),
        ("v256_w8", {"B_DHV": 256, "num_warps": 8}),
        ("kv128_w8", {"B_LKV": 128, "num_warps": 8}),
        ("lq32", {"B_LQ": 32}),
        ("lq32_kv32", {"B_LQ": 32, "B_LKV": 32}))},
}

FIELDS = ["tag", "shape", "impl", "variant", "chunk", "mode", "ms_median", "ms_min", "ms_max",
          "peak_mem_gib", "first_call_s", "diff_vs_default", "error"]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    # what runs: comma lists of SHAPES names, chunk sizes, implementations and modes, and the
    # same four for the tuning variants (--variants; --variant-shapes empty: --shapes)
    for what, default, variant_default in (("shapes", "fig4,b7,small", ""),
                                           ("chunks", "64,128,256,512", "128,256"),
                                           ("impls", "sig,exp,peer,fla", "sig"), ("modes", "fwd,fwdbw", "fwd")):
        ap.add_argument(f"--{what}", default=default, help=f"comma list of {what}")
        ap.add_argument(f"--variant-{what}", default=variant_default, help=f"{what} for --variants")
    ap.add_argument("--variants", default="", help="comma list of VARIANTS names, or 'all'")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--sweep", default="", help="'rec', 'fw' or 'rec,fw': time one kernel of the "
                    "tiled forward alone over a grid of tile configs (see sweep())")
    ap.add_argument("--sweep-chunks", default="128,256")
    ap.add_argument("--budget-s", type=float, default=500.0)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                    help="checkout whose kernels/ (package tfla) is measured; one per process")
    ap.add_argument("--tag", default="", help="names the checkout in every row (e.g. new, base)")
    ap.add_argument("--profile", default="",
                    help="comma list of shape:chunk[:variant] (chunk auto: impl sig_auto): "
                         "per-kernel CUDA time of one fwd+bwd call "
                         "(torch.profiler, mean of 5 calls) as rows impl=prof:<kernel>")
    return ap.parse_args(argv)


def make_inputs(shp, layout, *, device, dtype, grad=False):
    """The inputs of one shape (a SHAPES entry), seeded: (list of tensors, shape of h).

    layout "mlstm": q, k (B, NH, S, d_qk), v (B, NH, S, d_hv) in ``dtype``; i ~ N(0, 1) and
    f ~ N(3, 1) pre-activations (B, NH, S) in fp32. layout "fla": q, k, v (B, S, NH, d) and
    log forget gates logsigmoid(N(3, 1)) (B, S, NH), all in ``dtype``."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    B, NH, S, dqk, dhv = shp["B"], shp["NH"], shp["S"], shp["d_qk"], shp["d_hv"]

    def rn(*s, mean=0.0, dt=None):
        x = torch.randn(*s, generator=g, device=device, dtype=torch.float32) + mean
        return x.to(dt or dtype).requires_grad_(grad)
    if layout == "fla":
        import torch.nn.functional as F
        xs = [rn(B, S, NH, dqk), rn(B, S, NH, dqk), rn(B, S, NH, dhv)]
        gl = F.logsigmoid(torch.randn(B, S, NH, generator=g, device=device) + 3.0)
        xs.append(gl.to(dtype).requires_grad_(grad))
        return xs, (B, S, NH, dhv)
    xs = [rn(B, NH, S, dqk), rn(B, NH, S, dqk), rn(B, NH, S, dhv),
          rn(B, NH, S, dt=torch.float32), rn(B, NH, S, mean=3.0, dt=torch.float32)]
    return xs, (B, NH, S, dhv)


class Bench:
    def __init__(self, args):
        import torch

        self.torch = torch
        self.args = args
        self.smoke = args.smoke
        self.dev = "cpu" if self.smoke else "cuda"
        self.dtype = torch.float16 if self.smoke else torch.bfloat16
        self.deadline = time.time() + args.budget_s
        os.makedirs(args.out, exist_ok=True)
        self.csv_path = os.path.join(args.out, "rows.csv")
        new = not os.path.exists(self.csv_path)
        self.csv_file = open(self.csv_path, "a", newline="")
        self.writer = csv.DictWriter(self.csv_file, FIELDS)
        if new:
            self.writer.writeheader()
        self.rows = []

    # ------------------------------------------------------------ inputs and callables
    def inputs(self, shp, layout, grad):
        return make_inputs(shp, layout, device=self.dev, dtype=self.dtype, grad=grad)

    def kernel(self, impl, L):
        """(callable on the input list, input layout)."""
        import tfla
        if impl == "sig":
            return (lambda q, k, v, i, f: tfla.mlstm_sig(q, k, v, i, f, chunk_size=L)), "mlstm"
        if impl == "sig_auto":   # chunk_size "auto" (the default): L ignored, rows say chunk 0
            return (lambda q, k, v, i, f: tfla.mlstm_sig(q, k, v, i, f)), "mlstm"
        if impl == "sig_last":   # also the last state (C_S, n_S), as a prefill needs it
            return (lambda q, k, v, i, f: tfla.mlstm_sig(q, k, v, i, f, chunk_size=L,
                                                         return_last_state=True)[0]), "mlstm"
        if impl == "exp":
            return (lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=L)), "mlstm"
        if impl == "peer":
            from mlstm_kernels.torch.chunkwise.triton_xl_chunk_siging import (
                mlstm_siging_chunkwise__xl_chunk)
            return (lambda q, k, v, i, f: mlstm_siging_chunkwise__xl_chunk(
                q, k, v, i, f, chunk_size=L, normalize=False)), "mlstm"
        if impl == "fla":
            from fla.ops.simple_gla import chunk_simple_gla
            return (lambda q, k, v, g: chunk_simple_gla(q, k, v, g)[0]), "fla"
        raise ValueError(impl)

    @contextlib.contextmanager
    def variant(self, name):
        """Calls inside run with the Tuning of VARIANTS[name] (none for "": the rules)."""
        if not name:
            yield
            return
        from tfla.triton.tuning import Tuning, use_tuning
        with use_tuning(Tuning(**VARIANTS[name])):
            yield

    # ------------------------------------------------------------ one measurement
    def measure(self, shape_name, impl, L, mode, variant=""):
        torch = self.torch
        from tflabench.run.measure import time_callable
        row = dict(shape=shape_name, impl=impl, variant=variant, chunk=L, mode=mode)
        if time.time() > self.deadline:
            row["error"] = "skipped: budget"
            return self.emit(row)
        shp = (SMOKE_SHAPES if self.smoke else SHAPES)[shape_name]
        # a variant is only worth its time if it computes the same h (fwd) or gradients
        # (fwdbw) as the default configuration on the same inputs: diff_vs_default
        checked = bool(variant) and impl in ("sig", "sig_last", "exp")
        try:
            with self.variant(variant):
                fn, layout = self.kernel(impl, L)
                xs, hshape = self.inputs(shp, layout, grad=(mode == "fwdbw"))
                if mode == "fwd":
                    def call():
                        with torch.no_grad():
                            fn(*xs)
                else:
                    dh = torch.ones(hshape, device=self.dev, dtype=self.dtype)

                    def call():
                        for x in xs:
                            x.grad = None
                        fn(*xs).backward(dh)
                t0 = time.time()
                call()
                self.sync()
                row["first_call_s"] = round(time.time() - t0, 2)
                if checked and mode == "fwd":
                    with torch.no_grad():
                        h_var = fn(*xs)
                ms = time_callable(call, device=self.dev, warmup=self.args.warmup,
                                   iterations=self.args.iters)
                row.update(ms_median=round(statistics.median(ms), 4), ms_min=round(min(ms), 4),
                           ms_max=round(max(ms), 4))
                if not self.smoke:
                    self.sync()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    call()
                    self.sync()
                    row["peak_mem_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
                if checked and mode == "fwdbw":
                    g_var = [x.grad.float().clone() for x in xs]  # the last call's gradients
            if checked and mode == "fwd":
                # max |Δh| relative to max |h|
                with torch.no_grad():
                    h_def = fn(*xs).float()
                row["diff_vs_default"] = f"{((h_var.float() - h_def).abs().max() / h_def.abs().max()).item():.2e}"
            elif checked:
                # the largest over q, k, v, i, f of max |Δg| relative to max |g|
                call()
                diff = max(((gv - x.grad.float()).abs().max() / x.grad.float().abs().max()).item()
                           for gv, x in zip(g_var, xs))
                row["diff_vs_default"] = f"{diff:.2e}"
        except Exception as e:  # noqa: BLE001 - a failing kernel is a row, the run goes on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            traceback.print_exc(limit=3)
        if not self.smoke:
            torch.cuda.empty_cache()
        return self.emit(row)

    def sync(self):
        if not self.smoke:
            self.torch.cuda.synchronize()

    def emit(self, row):
        row.setdefault("tag", self.args.tag)
        full = {k: row.get(k, "") for k in FIELDS}
        self.writer.writerow(full)
        self.csv_file.flush()
        self.rows.append(full)
        print(" ".join(f"{k}={full[k]}" for k in FIELDS if full[k] != ""), flush=True)
        return full

    def profile(self, shape_name, L, variant="", impl="sig", calls=5):
        """Per-kernel CUDA time (ms per call) of one fwd+bwd call: rows impl=prof:<kernel>,
        mode fwdbw, and prof:total (the sum)."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile
        shp = SHAPES[shape_name]
        fn, layout = self.kernel(impl, L)
        xs, hshape = self.inputs(shp, layout, grad=True)
        dh = torch.ones(hshape, device=self.dev, dtype=self.dtype)

        def call():
            for x in xs:
                x.grad = None
            fn(*xs).backward(dh)
        with self.variant(variant):
            for _ in range(3):
                call()
            self.sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    call()
                self.sync()
        total = 0.0
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = e.self_cuda_time_total
            if t <= 0:
                continue
            ms = t / 1e3 / calls
            total += ms
            self.emit(dict(shape=shape_name, impl="prof:" + e.key[:60].replace(",", ";"), chunk=L,
                           mode="fwdbw", ms_median=round(ms, 4),
                           variant=f"{variant} n={e.count // calls}"))
        self.emit(dict(shape=shape_name, impl="prof:total", chunk=L, mode="fwdbw",
                       ms_median=round(total, 4), variant=variant))
        del xs, dh
        torch.cuda.empty_cache()

    # ------------------------------------------------------------ the tiled forward's kernels alone
    def flat_inputs(self, shape_name):
        """(recurrent module, parallel-fw module, (q, k, v, i, f) flattened to (B*NH, S, ...)):
        the inputs the tiled forward's kernels take, for timing them one by one."""
        from tfla.triton.chunkwise import kernels
        shp = (SMOKE_SHAPES if self.smoke else SHAPES)[shape_name]
        mods = kernels()
        rec, pfw = mods.recurrent, mods.parallel_fw
        xs, _ = self.inputs(shp, "mlstm", grad=False)
        BH = shp["B"] * shp["NH"]
        q, k, v = (x.reshape(BH, shp["S"], -1) for x in xs[:3])
        i, f = (x.reshape(BH, shp["S"]) for x in xs[3:])
        return rec, pfw, (q, k, v, i, f)

    def breakdown(self, shape_name, L):
        torch = self.torch
        from tflabench.run.measure import time_callable
        rec, pfw, (q, k, v, i, f) = self.flat_inputs(shape_name)
        with torch.no_grad():
            gates = rec.chunk_gates(i, f, L=L, is_exp=False)
            st = rec.recurrent_fw(k, v, gates[1], gates[4], gates[5], None, None, None, L=L,
                                  is_exp=False)
            parts = {
                "gates": lambda: rec.chunk_gates(i, f, L=L, is_exp=False),
                "recurrent": lambda: rec.recurrent_fw(k, v, gates[1], gates[4], gates[5], None,
                                                      None, None, L=L, is_exp=False, with_n=False),
                "parallel_H": lambda: pfw.parallel_fw(q, k, v, gates[0], gates[2], gates[3],
                                                      st[0], st[1], st[2], L=L, is_exp=False,
                                                      normalize=False, eps=1e-6, limit=False),
            }
            for name, fn in parts.items():
                fn()
                self.sync()
                ms = time_callable(fn, device=self.dev, warmup=3, iterations=10)
                self.emit(dict(shape=shape_name, impl="sig:" + name, chunk=L, mode="fwd",
                               ms_median=round(statistics.median(ms), 4), ms_min=round(min(ms), 4),
                               ms_max=round(max(ms), 4)))


def _rec_grid(shp, L):
    """Stage-A configs of the recurrent kernel: state blocks x warps (3 stages)."""
    out = []
    for bq, bv in [(64, 64), (64, 128), (128, 64), (128, 128), (32, 64), (64, 32), (32, 128)]:
        if bq > max(16, shp["d_qk"]) or bv > max(16, shp["d_hv"]):
            continue
        for w in (4, 8):
            out.append(dict(B_DQK=bq, B_DHV=bv, num_warps=w, num_stages=3))
    return out


def _fw_grid(shp, L):
    """Stage-A configs of the parallel H kernel: tiles x d_hv block x warps (2 stages); where
    d_qk > 128 also the whole d_qk as one block (B_DQK)."""
    out = []
    for blq, blkv in [(64, 64), (128, 64), (64, 32), (128, 128)]:
        if blq > L:
            continue
        for bv in (64, 128, 256):
            if bv > max(16, shp["d_hv"]):
                continue
            for w in (4, 8):
                for bqk in ((128, 256) if shp["d_qk"] > 128 else (None,)):
                    cfg = dict(B_LQ=blq, B_LKV=blkv, B_DHV=bv, num_warps=w, num_stages=2)
                    out.append(cfg if bqk is None else dict(cfg, B_DQK=bqk))
    return out


def sweep(b, shape_name, L, which):
    """Time the tiled forward's recurrent or H kernel alone over a grid of configs (stage A),
    then the best one with other pipeline depths / pieces / d_qk blocks (stage B)."""
    torch = b.torch
    from tflabench.run.measure import time_callable
    from tfla.triton.tuning import Tuning
    shp = (SMOKE_SHAPES if b.smoke else SHAPES)[shape_name]
    rec, pfw, (q, k, v, i, f) = b.flat_inputs(shape_name)
    results = []

    def run(cfg):
        if time.time() > b.deadline:
            return None
        row = dict(shape=shape_name, impl=f"sweep_{which}", variant=repr(cfg), chunk=L, mode="fwd")
        try:
            with torch.no_grad():
                gates = rec.chunk_gates(i, f, L=L, is_exp=False)
                if which == "rec":
                    fn = lambda: rec.recurrent_fw(k, v, gates[1], gates[4], gates[5], None,  # noqa: E731
                                                  None, None, L=L, is_exp=False, with_n=False,
                                                  tuning=Tuning(state=cfg))
                else:
                    st = rec.recurrent_fw(k, v, gates[1], gates[4], gates[5], None, None, None,
                                          L=L, is_exp=False, with_n=False)
                    fn = lambda: pfw.parallel_fw(q, k, v, gates[0], gates[2], gates[3], st[0],  # noqa: E731
                                                 st[1], st[2], L=L, is_exp=False,
                                                 normalize=False, eps=1e-6, limit=False,
                                                 tuning=Tuning(fw=cfg))
                fn()
                b.sync()
                ms = time_callable(fn, device=b.dev, warmup=3, iterations=10)
                row.update(ms_median=round(statistics.median(ms), 4), ms_min=round(min(ms), 4),
                           ms_max=round(max(ms), 4))
                results.append((statistics.median(ms), cfg))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        b.emit(row)

    for cfg in (_rec_grid if which == "rec" else _fw_grid)(shp, L):
        run(cfg)
    if not results:
        return
    best = min(results, key=lambda r: r[0])[1]
    if which == "rec":
        extra = [dict(best, num_stages=2), dict(best, num_stages=4)]
        if L >= 128:
            extra.append(dict(best, PIECE=64))
    else:
        extra = [dict(best, num_stages=3), dict(best, num_stages=1)]
        if shp["d_qk"] > 64:
            extra.append(dict(best, B_DQK=64))
        if shp["d_qk"] > 128:
            extra.append(dict(best, B_DQK=256))
    for cfg in extra:
        run(cfg)
    best_ms, best = min(results, key=lambda r: r[0])
    print(f"BEST {which} {shape_name} L{L}: {best_ms:.4f} ms {best}", flush=True)


def print_tables(rows):
    from collections import defaultdict
    by = defaultdict(dict)
    for r in rows:
        if r["ms_median"] != "":
            key = (r["shape"], r["mode"])
            name = r["impl"] + (f"[{r['variant']}]" if r["variant"] else "")
            by[key][(name, r["chunk"])] = r["ms_median"]
    for (shape, mode), d in by.items():
        chunks = sorted({c for _, c in d}, key=int)
        names = sorted({n for n, _ in d})
        print(f"\n== {shape} {mode} (ms median) ==")
        print("impl".ljust(28) + "".join(f"L{c}".rjust(10) for c in chunks))
        for n in names:
            print(n.ljust(28) + "".join(str(d.get((n, c), "-")).rjust(10) for c in chunks))


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path[:0] = [os.path.join(args.root, "kernels"), os.path.join(os.path.dirname(__file__), "..")]
    b = Bench(args)
    for item in filter(None, args.profile.split(",")):
        shape, L, *var = item.split(":")
        try:
            if L == "auto":      # chunk_size "auto" (impl sig_auto)
                b.profile(shape, 0, *var, impl="sig_auto")
            else:
                b.profile(shape, int(L), *var)
        except Exception:  # noqa: BLE001 - a failed profile is reported, the run goes on
            traceback.print_exc(limit=3)
    shapes = ["tiny"] if args.smoke else args.shapes.split(",")
    chunks = [int(c) for c in args.chunks.split(",")]
    impls = args.impls.split(",")
    modes = args.modes.split(",")
    if args.smoke:
        impls = [x for x in impls if x not in ("peer", "fla")]
    if args.sweep:
        for L in [int(c) for c in args.sweep_chunks.split(",")]:
            for shape in shapes:
                for which in args.sweep.split(","):
                    sweep(b, shape, L, which)
        return
    for shape in shapes:
        if args.breakdown:
            for L in chunks:
                b.breakdown(shape, L)
        for mode in modes:
            for impl in impls:
                for L in ([64] if impl == "fla" else [0] if impl == "sig_auto" else chunks):
                    b.measure(shape, impl, L, mode)
    if args.variants:
        names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
        for shape in (args.variant_shapes.split(",") if args.variant_shapes else shapes):
            for mode in args.variant_modes.split(","):
                for L in [int(c) for c in args.variant_chunks.split(",")]:
                    for impl in args.variant_impls.split(","):
                        for name in names:
                            b.measure(shape, impl, L, mode, variant=name)
    print_tables(b.rows)


if __name__ == "__main__":
    main()
