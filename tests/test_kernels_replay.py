"""A call's recorded program (``tfla.triton.replay``) on plain CPU tensors, with a stand-in
for a kept launch: what it records, what it drops, what it refuses, and that a replay on new
inputs computes what the recorded Python computes. The replay of the real kernels' calls
(launches compared with the plain path's): ``test_kernels_host.py``."""

from __future__ import annotations

import pytest
import torch

# imported by the fixture, under TRITON_INTERPRET=1 as every kernel test imports tfla: a
# module-level import at collection would fix tfla's shared @triton.jit helpers as compiled
# ones for every later test of the process
fastlaunch = replay = None


class Kept:
    """Stands in for ``fastlaunch._Launch``: records what each launch hands the launcher."""

    descs = ()

    def __init__(self):
        self.calls = []

    def go(self, final, device):
        self.calls.append(list(final))

    def __call__(self, args, device):
        self.calls.append(list(args))


@pytest.fixture(autouse=True)
def fresh(interpret):
    global fastlaunch, replay
    from tfla.triton import fastlaunch, replay
    replay.clear()
    yield
    replay.clear()


def record(body, inputs, number=1):
    """Record ``body(*inputs)`` (returning its output list) as signature ``number``."""
    rec = replay.Recorder(number, inputs)
    with rec:
        outs = body(*inputs)
    rec.finish(outs)
    return outs, replay.program(number)


def body_of(kept):
    def body(a, b):
        flat = a.reshape(-1, 4)                  # a view only the launch reads
        out = torch.empty((2, 4))
        fastlaunch.recorder().launch(kept, [flat, out, 7], 0)   # as fastlaunch.run reports it
        total = (a * b).sum((-1,))                # torch work whose values are returned
        last = out.reshape(8)[-1:].clone()
        return [out.reshape(1, 8), total, last]
    return body


def test_replay_computes_what_the_recorded_python_computes_on_new_inputs():
    kept = Kept()
    a, b = torch.arange(8.0).view(2, 4), torch.full((2, 4), 2.0)
    outs, prog = record(body_of(kept), (a, b))
    assert prog is not None and prog.launches == 1
    a2, b2 = torch.arange(8.0, 16.0).view(2, 4), torch.full((2, 4), 3.0)
    again = prog.run((a2, b2))
    assert torch.equal(again[1], (a2 * b2).sum(-1))
    assert again[0].shape == (1, 8) and again[2].shape == (1,)
    # fresh outputs: nothing of the recorded call's is handed out again
    assert again[0].data_ptr() != outs[0].data_ptr()
    # the launch got the new input where the recording passed its view (same address: the
    # root itself), the new allocation, and the constant
    flat, out, seven = kept.calls[-1]
    assert flat is a2 and out.data_ptr() == again[0].data_ptr() and seven == 7


def test_views_only_launches_read_are_not_made_and_a_view_is_taken_once():
    kept = Kept()

    def body(a):
        v1, v2 = a.view(8), a.view(8)             # the same view twice
        fastlaunch.recorder().launch(kept, [v1, v2], 0)
        return [a.view(4, 2)]

    _, prog = record(body, (torch.zeros(2, 4),))
    # the launch's views are not steps (their root goes to the launch); the output's view is
    assert len(prog.steps) == 2
    x = torch.ones(2, 4)
    (out,) = prog.run((x,))
    assert out.shape == (4, 2) and out.data_ptr() == x.data_ptr()
    assert kept.calls[-1][0] is x and kept.calls[-1][1] is x


def test_what_nothing_reads_is_dropped():
    kept = Kept()

    def body(a):
        torch.empty(100)                          # unread
        a.view(8)                                 # unread
        out = torch.zeros(3)
        fastlaunch.recorder().launch(kept, [out], 0)
        return []

    _, prog = record(body, (torch.zeros(2, 4),))
    assert len(prog.steps) == 2                   # the zeros and the launch


@pytest.mark.parametrize("why", ["same tensor twice", "a value the host reads",
                                 "a launch through Triton", "no launch"])
def test_calls_that_cannot_be_replayed_make_no_program(why):
    kept = Kept()

    def body(a, b):
        if why == "a value the host reads" and a.sum().item() > 0:
            pass
        if why == "a launch through Triton":
            fastlaunch.unkept()                   # as common.launch reports it
        if why != "no launch":
            fastlaunch.recorder().launch(kept, [a], 0)
        return [a * 2]

    a = torch.ones(3)
    inputs = (a, a) if why == "same tensor twice" else (a, torch.ones(3))
    _, prog = record(body, inputs)
    assert prog is None


def test_recording_starts_at_a_signatures_second_call_and_stops_after_failures():
    x = torch.ones(2)
    assert replay.recorder(5, (x,)) is None       # the first call: its launches go through Triton
    for _ in range(replay.MAX_TRIES):
        rec = replay.recorder(5, (x,))
        assert rec is not None
        rec.finish([])                            # no launch: a failed recording
    assert replay.recorder(5, (x,)) is None
    assert replay.recorder(None, (x,)) is None    # no signature (Triton's interpreter)
    replay.ENABLED = False
    try:
        assert replay.recorder(6, (x,)) is None and replay.recorder(6, (x,)) is None
    finally:
        replay.ENABLED = True


def test_step_records_a_function_outside_torch_dispatch_with_its_result_as_a_slot():
    kept = Kept()
    made = []

    def stream_like():
        made.append(object())
        return made[-1]

    def body(a):
        s = replay.step(stream_like)
        replay.step(lambda t, handle: None, a, s)
        fastlaunch.recorder().launch(kept, [a], 0)
        return []

    _, prog = record(body, (torch.zeros(1),))
    prog.run((torch.zeros(1),))
    assert len(made) == 2                         # made again by the replay


def test_taking_the_kernel_modules_anew_forgets_kept_launches_and_programs(monkeypatch):
    """Kept launches and programs hold the compiled kernels of the modules they were made
    with; once ``chunkwise.kernels`` takes the modules anew (TRITON_INTERPRET switched), a
    kept one would launch the old modules' kernels, so none may survive."""
    from tfla.triton import chunkwise

    mods = chunkwise.kernels()
    assert chunkwise.kernels() is mods                    # the kept modules: nothing forgotten
    fastlaunch._KEPT["sentinel"] = object()
    replay._PROGRAMS[-1] = object()
    assert chunkwise.kernels() is mods and "sentinel" in fastlaunch._KEPT and -1 in replay._PROGRAMS
    stale = type("Stale", (), {"INTERPRET": not mods[0].INTERPRET})()
    monkeypatch.setitem(chunkwise._KERNEL_MODULES, "mods", (stale,))  # as after the switch changed
    again = chunkwise.kernels()
    assert all(m.INTERPRET == mods[0].INTERPRET for m in again)
    assert "sentinel" not in fastlaunch._KEPT and -1 not in replay._PROGRAMS
