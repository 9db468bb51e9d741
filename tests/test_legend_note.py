"""The legend's note on how ours and the peers are drawn names only kernels the figure
shows (issue 48.4): a set without the authors' kernels never reads "mlstm_kernels"."""

from __future__ import annotations

import pytest

from tflabench.report.plots.style import ours_key

OURS = ("mLSTMsig TFLA xl_chunk (ours)", "tfla", {"variant": "sig", "algorithm": "xl_chunk"})
AUTHORS = ("mLSTMsig TFLA xl_chunk (mlstm_kernels)", "mlstm_kernels", {"variant": "sig", "algorithm": "xl_chunk"})
FLA = ("GLA (FLA chunk)", "fla", {"kernel": "chunk_gla"})


def _legend_texts(kernels, runtime_figure) -> tuple[str, list[str]]:
    """The benchmark figure of a set of ``kernels`` drawn; its legend's title and entries."""
    (legend,) = runtime_figure(kernels).legends
    return legend.get_title().get_text(), [t.get_text() for t in legend.get_texts()]


@pytest.mark.parametrize("kernels, named, absent", [
    ([OURS, FLA], "solid, filled: ours; dashed, hollow: peers", ("mlstm_kernels", "authors", "other")),
    ([OURS], "solid, filled: ours", ("mlstm_kernels", "dashed", "peers")),
    ([OURS, AUTHORS], "solid, filled: ours; dashed, hollow: the authors' kernels (mlstm_kernels)",
     ("other", " peers")),
    ([OURS, AUTHORS, FLA],
     "solid, filled: ours; dashed, hollow: the authors' kernels (mlstm_kernels) and other peers", ()),
])
def test_the_benchmark_figure_legend_names_only_kernels_in_the_set(runtime_figure, kernels, named, absent):
    title, entries = _legend_texts(kernels, runtime_figure)
    assert title == named
    assert entries == [label for label, _, _ in kernels]  # each kernel of the set once, none other
    for word in absent:
        assert word not in title


def test_without_a_kernel_of_ours_the_legend_has_no_note(runtime_figure):
    title, entries = _legend_texts([AUTHORS, FLA], runtime_figure)
    assert title == "" and set(entries) == {AUTHORS[0], FLA[0]}
    assert ours_key([(FLA[0], "fla")]) is None
    # labels without a backend: the "(ours)" and "(mlstm_kernels)" notes decide
    assert ours_key([(OURS[0], None), (AUTHORS[0], None)]).endswith("the authors' kernels (mlstm_kernels)")
