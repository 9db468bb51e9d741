"""``torch.compile`` of a training step through ``tfla.mlstm_sig`` / ``tfla.mlstm_exp`` on a
GPU: graph breaks, and the loss and every gradient against the eager step, per compile mode;
then ``torch.library.opcheck`` of the operators (docs/kernels.md, "Registered operators").

The step: h = tfla.mlstm_<variant>(q, k, v, i, f, initial_state=C0, return_last_state=True)
(or without states), loss = sum(h²) + ½ sum(C_S²), then ``loss.backward()``. Modes:
``fullgraph`` (``torch.compile(fullgraph=True)``, inductor), ``reduce-overhead`` (the same
with CUDA graphs; each compiled step is called three times, the third compared) and
``aot_eager``. Shape: Figure 4's heads (16, d_qk 128, d_hv 256), bfloat16, B and S from
the options.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/compile_check.py [--batch 2] [--seq 2048]
        [--variants sig,exp]

Prints one table: variant, states, compile mode, graph breaks, the loss's relative difference
to eager (torch's own reduction, which inductor may sum in another order: float32 rounding,
at most 1e-5), the largest absolute difference of the gradients (dq, dk, dv, di, df, dC0: our
kernels' outputs) and whether they are bit for bit (else the tensors that differ); opcheck
rows say ``ok`` or the failing check. Exit status 2 without a CUDA GPU, 1 where a gradient is
not bit for bit, the loss differs by more, a graph breaks, or opcheck fails.
"""

from __future__ import annotations

import argparse
import os
import sys

MODES = {"fullgraph": dict(fullgraph=True), "reduce-overhead": dict(fullgraph=True,
                                                                    mode="reduce-overhead"),
         "aot_eager": dict(fullgraph=True, backend="aot_eager")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--variants", default="sig,exp", help="comma list of sig, exp")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - {"sig", "exp"}:
        print(f"compile_check.py: --variants={args.variants!r}; allowed: sig, exp or both", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels"))
    import torch

    if not torch.cuda.is_available():
        print("compile_check.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    import tfla
    import tfla.ops  # noqa: F401  (the operators)

    B, NH, S, d_qk, d_hv = args.batch, 16, args.seq, 128, 256
    g = torch.Generator(device="cuda").manual_seed(0)

    def rn(*shape, mean=0.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g, device="cuda") + mean).to(dtype)

    xs = [rn(B, NH, S, d_qk), rn(B, NH, S, d_qk), rn(B, NH, S, d_hv),
          rn(B, NH, S, dtype=torch.float32), rn(B, NH, S, mean=3.0, dtype=torch.float32)]
    C0 = rn(B, NH, d_qk, d_hv, dtype=torch.float32) * 0.1
    rows, failed = [], False
    for variant in variants:
        fn = tfla.mlstm_sig if variant == "sig" else tfla.mlstm_exp
        for states in (False, True):
            loss = _loss(fn, states)
            eager = _step(loss, xs, C0, torch)
            for mode, kw in MODES.items():
                torch._dynamo.reset()
                try:
                    breaks = torch._dynamo.explain(loss)(*_leaves(xs, C0)).graph_break_count
                    compiled = torch.compile(loss, **kw)
                    for _ in range(3):
                        got = _step(compiled, xs, C0, torch)
                except Exception as exc:           # one row says what failed
                    rows.append((variant, str(states), mode, "-", "-", "-",
                                 f"error: {type(exc).__name__}: {str(exc).splitlines()[0]}"))
                    failed = True
                    continue
                # the loss is torch's reduction (inductor may sum in another order): within
                # float32 rounding; the gradients are our kernels' outputs: bit for bit
                loss_rel = ((eager[0] - got[0]).abs() / eager[0].abs().clamp_min(1e-30)).item()
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(eager[1:], got[1:]))
                differ = [name for name, a, b in zip(GRADS, eager[1:], got[1:]) if not torch.equal(a, b)]
                failed |= bool(differ) or breaks > 0 or loss_rel > 1e-5
                rows.append((variant, str(states), mode, str(breaks), f"{loss_rel:.1e}", f"{diff:.3e}",
                             "yes" if not differ else "no: " + ", ".join(differ)))
    for variant in variants:
        for states in (False, True):
            n0 = torch.zeros(B, NH, d_qk, device="cuda") if states else None
            m0 = torch.zeros(B, NH, device="cuda") if (states and variant == "exp") else None
            small = [x[:, :2, :256].clone().requires_grad_(True) for x in xs]
            C0s = C0[:, :2].clone().requires_grad_(True) if states else None
            opargs = (*small, C0s, n0[:, :2] if states else None,
                      m0[:, :2] if m0 is not None else None, variant, 0, "xl_chunk",
                      variant == "exp", 1e-6, states, True, 0)
            try:
                torch.library.opcheck(torch.ops.tfla.mlstm_fwd.default, opargs)
                result = "ok"
            except Exception as exc:
                result = f"failed: {str(exc).splitlines()[0]}"
                failed = True
            rows.append((variant, str(states), "opcheck", "-", "-", "-", result))
    _print(rows)
    return 1 if failed else 0


#: the tensors compared bit for bit after the loss: the gradients of q, k, v, i, f and C0
GRADS = ("dq", "dk", "dv", "di", "df", "dC0")


def _loss(fn, states):
    def loss(q, k, v, i, f, C0):
        if not states:
            return fn(q, k, v, i, f).float().square().sum()
        h, last = fn(q, k, v, i, f, initial_state=C0, return_last_state=True)
        return h.float().square().sum() + 0.5 * last[0].square().sum()
    return loss


def _leaves(xs, C0):
    return [x.detach().clone().requires_grad_(True) for x in (*xs, C0)]


def _step(loss, xs, C0, torch):
    leaves = _leaves(xs, C0)
    value = loss(*leaves)
    value.backward()
    torch.cuda.synchronize()
    return [value.detach().clone()] + [x.grad.clone() if x.grad is not None
                                       else torch.zeros_like(x) for x in leaves]


def _print(rows) -> None:
    head = ("variant", "states", "compile mode", "graph breaks", "loss rel. diff",
            "max |diff| of gradients", "gradients bit for bit")
    lines = [head, *rows]
    widths = [max(len(r[j]) for r in lines) for j in range(len(head))]
    for r in lines:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
