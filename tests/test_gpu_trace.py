"""`run --gpu-trace`: nvidia-smi's samples parsed and summarised, the sampler's process
started, read, windowed and stopped (a fake nvidia-smi script stands in for the driver's)."""

from __future__ import annotations

import math
import os
import stat
import time

import pytest

from tflabench.run.gpu_trace import GpuTrace, parse_sample, summarise


def test_a_sample_line_parses_and_anything_else_is_none():
    assert parse_sample("1980, 0x0000000000000004, 436.29\n") == (1980.0, 0x4, 436.29)
    mhz, reasons, power = parse_sample("345, 0x0000000000000001, [N/A]")
    assert (mhz, reasons) == (345.0, 1) and math.isnan(power)
    for line in ("", "No devices were found", "1980, 0x4", "1980, busy, 400", "a, b, c, d"):
        assert parse_sample(line) is None


def test_summary_takes_busy_clocks_the_highest_power_and_names_slowdowns_in_order():
    samples = [(345.0, 0x1, 70.0), (1980.0, 0x0, 480.0), (1755.0, 0x24, 699.0), (1965.0, 0x2, math.nan)]
    cols = summarise(samples)
    assert cols == {"gpu_sm_mhz_min": 1755.0, "gpu_power_w_max": 699.0,
                    "gpu_slowdowns": "sw_power_cap,sw_thermal_slowdown"}
    assert summarise([(1980.0, 0x0, 300.0), (1980.0, 0x2, 310.0)])["gpu_slowdowns"] == ""
    idle_only = summarise([(345.0, 0x1, 70.0)])
    assert idle_only["gpu_sm_mhz_min"] is None and idle_only["gpu_slowdowns"] == ""
    assert summarise([]) == {"gpu_sm_mhz_min": None, "gpu_power_w_max": None, "gpu_slowdowns": None}


@pytest.fixture
def fake_smi(tmp_path):
    """An executable that records its arguments and prints a sample every 20 ms: a first
    phase of power-capped samples, then steady ones."""
    args = tmp_path / "args.txt"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$@" >> "{args}"\n'
        "case \"$*\" in *-lms*) ;; *) echo '612.50'; exit 0;; esac\n"   # the power-field probe
        "for n in 1 2 3; do echo '1500, 0x0000000000000004, 700.00'; sleep 0.02; done\n"
        "while true; do echo '1980, 0x0000000000000000, 450.00'; sleep 0.02; done\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, args


def test_the_trace_samples_one_gpu_and_keeps_only_its_window(fake_smi):
    script, args = fake_smi
    with GpuTrace("3", period_ms=20, command=str(script)) as trace:
        trace.wait_first()
        time.sleep(0.15)  # the capped phase is over
        start = time.monotonic()
        time.sleep(0.15)
        cols = trace.columns(start, time.monotonic())
        everything = trace.columns(0.0, time.monotonic())
    assert trace._process.poll() is not None  # stopped on exit
    probe, loop = (line.split() for line in args.read_text().splitlines())
    assert probe == ["-i", "3", "--query-gpu=power.draw.instant", "--format=csv,noheader,nounits"]
    assert loop[:2] == ["-i", "3"] and "--query-gpu=clocks.sm,clocks_throttle_reasons.active,power.draw.instant" in loop
    assert loop[-2:] == ["-lms", "20"]
    assert cols == {"gpu_sm_mhz_min": 1980.0, "gpu_power_w_max": 450.0, "gpu_slowdowns": ""}
    assert everything == {"gpu_sm_mhz_min": 1500.0, "gpu_power_w_max": 700.0, "gpu_slowdowns": "sw_power_cap"}


def test_the_power_field_falls_back_to_the_average_where_the_driver_has_no_instant_reading(tmp_path):
    """An older driver refuses power.draw.instant (exit 2, 'not a valid field'), another
    answers [N/A]: the trace then asks for power.draw, and a missing nvidia-smi costs nothing."""
    from tflabench.run.gpu_trace import power_field

    for name, answer in (("refuses", "echo 'Field \"power.draw.instant\" is not a valid field to query.'; exit 2"),
                         ("na", "echo '[N/A]'; exit 0"), ("answers", "echo '431.07'; exit 0")):
        script = tmp_path / f"smi-{name}"
        script.write_text(f"#!/usr/bin/env bash\n{answer}\n")
        script.chmod(0o755)
        expected = "power.draw.instant" if name == "answers" else "power.draw"
        assert power_field("0", str(script)) == expected, name
    assert power_field("0", os.fspath(tmp_path / "no-such-nvidia-smi")) == "power.draw"


def test_without_nvidia_smi_the_trace_gives_none_columns_and_never_raises(tmp_path):
    missing = os.fspath(tmp_path / "no-such-nvidia-smi")
    with GpuTrace("0", command=missing) as trace:
        trace.wait_first(timeout_s=0.2)
        cols = trace.columns(0.0, time.monotonic())
    assert cols == {"gpu_sm_mhz_min": None, "gpu_power_w_max": None, "gpu_slowdowns": None}
    failing = tmp_path / "failing-smi"
    failing.write_text("#!/usr/bin/env bash\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(0o755)
    with GpuTrace("0", command=str(failing)) as trace:
        trace.wait_first(timeout_s=2)
        assert trace.columns(0.0, time.monotonic())["gpu_slowdowns"] is None


def test_run_gpu_trace_reaches_the_cases_and_the_metadata(tmp_path):
    """`tflabench run --gpu-trace` of a CPU suite: the run records the option; CPU rows have
    no GPU to trace, so their trace columns stay None and the run is unchanged otherwise."""
    import yaml
    from typer.testing import CliRunner

    from tflabench.cli import app
    from tflabench.store.results import load_results

    data = {"name": "trace_cpu", "device": "cpu", "dtype": "float32", "modes": ["fwd"],
            "timing": {"warmup": 1, "iterations": 3, "timeout_s": 120}, "numerics": {"max_seq_len": 64},
            "model": {"embedding_dim": 64}, "sweep": {"batch": 1, "seq_len": [64]},
            "kernels": [{"backend": "sdpa", "label": "sdpa math", "params": {"impl": "math", "heads": 2, "d_hv": 32}}]}
    (tmp_path / "trace_cpu.yaml").write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "trace_cpu.yaml"), "--gpu-trace", "--no-progress",
                                      "--no-plots", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (directory,) = [p.parent for p in (tmp_path / "out").glob("*/*/metadata.json")]
    rs = load_results(directory)
    assert rs.metadata["gpu_trace"] is True and rs.metadata["profile"] is False
    assert set(rs.rows["status"]) == {"ok"}
    assert rs.rows[["gpu_sm_mhz_min", "gpu_power_w_max", "gpu_slowdowns"]].isna().all().all()


def test_a_killed_worker_leaves_no_sampler_behind(tmp_path):
    """The pool kills a worker at its case's timeout (SIGKILL): its nvidia-smi goes too, even
    one that ignores the broken pipe (the fake sampler below does)."""
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "smi.pid"
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/usr/bin/env bash\n"
                      "case \"$*\" in *-lms*) ;; *) echo '450.00'; exit 0;; esac\n"  # the power-field probe
                      f'echo $$ > "{pid_file}"\n'
                      "trap '' PIPE\n"
                      "while true; do echo '1980, 0x0000000000000000, 450.00' 2>/dev/null; sleep 0.02; done\n")
    script.chmod(0o755)
    worker = subprocess.Popen([sys.executable, "-c", (
        "import time; from tflabench.run.gpu_trace import GpuTrace\n"
        f"t = GpuTrace('0', period_ms=20, command={str(script)!r}).__enter__()\n"
        "t.wait_first(); print('sampling', flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert worker.stdout.readline().strip() == "sampling"
        smi = int(pid_file.read_text())
        os.kill(smi, 0)  # running
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(smi, 0)
            except ProcessLookupError:
                break
            # a zombie until reaped by init counts as gone: check its state
            state = open(f"/proc/{smi}/stat").read().split(")")[-1].split()[0]
            if state == "Z":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("nvidia-smi outlived the worker that started it")
    finally:
        worker.kill()


def test_the_results_table_shows_the_trace_only_for_traced_rows(tmp_path):
    from rich.console import Console

    from tflabench.store.results import load_results, write_results
    from tflabench.report.tables import summary_table

    def row(seq_len, **trace):
        return dict(suite="s", kernel="k", backend="tfla", family="mlstm", params={"chunk_size": 64},
                    mode="fwd", dtype="bfloat16", device="cuda", batch=1, seq_len=seq_len, heads=8, d_qk=64,
                    d_hv=64, chunk_size=64, embedding_dim=512, status="ok", ms_median=1.0, **trace)

    def render(rows, name):
        rs = load_results(write_results(tmp_path / name, rows, {"suite": "s"}))
        console = Console(width=250, record=True)
        console.print(summary_table(rs.rows))
        return console.export_text()

    traced = render([row(256, gpu_sm_mhz_min=1755.0, gpu_power_w_max=699.0, gpu_slowdowns="sw_power_cap"),
                     row(512, gpu_sm_mhz_min=1980.0, gpu_power_w_max=450.0, gpu_slowdowns="")], "a")
    assert "GPU clock" in traced and "1755 MHz sw_power_cap" in traced and "1980 MHz" in traced
    assert "GPU clock" not in render([row(256), row(512)], "b")


def test_the_traced_gpu_is_named_by_its_uuid_whatever_order_cuda_counts_in(monkeypatch):
    """nvidia-smi numbers GPUs in PCI order, CUDA fastest first: the harness names the GPU by
    its UUID where torch gives one, by its index otherwise."""
    import types

    import torch

    from tflabench.run import measure

    props = types.SimpleNamespace(uuid="0b42632a-bc5c-f731-724b-6936a19c4b24")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props if i == 1 else None)
    assert measure.nvidia_smi_id() == "GPU-0b42632a-bc5c-f731-724b-6936a19c4b24"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace())
    monkeypatch.setattr(measure, "gpu_columns", lambda: {"gpu_index": "3", "gpu_name": "x"})
    assert measure.nvidia_smi_id() == "3"
