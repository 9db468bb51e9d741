"""The gate regimes of docs/tfla-verification.md 5.1, shared by the kernel and reference
tests: name -> (input-gate mean, input-gate std, forget-gate mean, forget-gate std) of the
normal distributions the gate pre-activations are drawn from."""

VERIFICATION_REGIMES = {
    "std": (0.0, 1.0, 2.0, 1.5),
    "large_positive_input_gate": (30.0, 5.0, 2.0, 1.5),
    "strongly_negative_input_gate": (-30.0, 5.0, 2.0, 1.5),
    "wide_input_gate": (0.0, 25.0, 2.0, 1.5),
    "strong_forgetting": (0.0, 1.0, -8.0, 2.0),
    "weak_forgetting": (0.0, 1.0, 8.0, 1.0),
}
