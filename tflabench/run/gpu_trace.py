"""The GPU's clock, power and slowdown reasons while a case is timed (``run --gpu-trace``).

A GPU that lowers its clocks under a power or thermal limit makes a kernel slower for a
while, and the timings of that case spread (``compare``'s noise warning). The harness cannot
tell that from a slower kernel by the timings alone; the driver can. :class:`GpuTrace` runs
``nvidia-smi`` in a loop beside the worker (one query every :data:`PERIOD_MS` ms: SM clock,
the active clock-event reasons, power draw) and :meth:`GpuTrace.columns` summarises the
samples taken between two moments (the timed calls of a case) as the row's
:data:`tflabench.store.schema.GPU_TRACE_COLUMNS`:

- ``gpu_sm_mhz_min``: the lowest SM clock (MHz) among the samples where the GPU was busy
  (the idle reason not set);
- ``gpu_power_w_max``: the highest power draw (W): instantaneous where ``nvidia-smi`` gives it
  (``power.draw.instant``), else its ``power.draw`` (:func:`power_field`);
- ``gpu_slowdowns``: the slowdown reasons seen, comma-separated in :data:`SLOWDOWNS`' order
  (``""``: none seen); None, like the other two, when no sample fell in the window or
  ``nvidia-smi`` is not there.

The reasons are NVML's clock-event reasons (``nvmlClocksEventReasons``; ``nvidia-smi
--help-query-gpu``, ``clocks_throttle_reasons.*``); of them, :data:`SLOWDOWNS` lower the
clocks under load. Nothing here imports torch; a failing ``nvidia-smi`` costs the columns,
never the measurement.
"""

from __future__ import annotations

import functools
import math
import signal
import subprocess
import sys
import threading
import time

#: Milliseconds between two samples (``nvidia-smi -lms``).
PERIOD_MS = 50
#: The clock-event reasons that lower the clocks under load: bit of
#: ``clocks_throttle_reasons.active`` -> name (NVML ``nvmlClocksEventReasons``).
SLOWDOWNS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
#: The reason set while the GPU has nothing to run.
IDLE = 0x1
#: What one sample asks for, in this order, before the power field.
QUERY = "clocks.sm,clocks_throttle_reasons.active"
#: The power fields, preferred first: the instantaneous draw, else ``power.draw``, which on
#: recent GPUs is the driver's one-second average (``nvidia-smi --help-query-gpu``): a case
#: shorter than a second reads below its kernel's draw there.
POWER_FIELDS = ("power.draw.instant", "power.draw")


def _number(text: str) -> float:
    """A float from one CSV field (NaN for ``[N/A]`` and the like)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_sample(line: str) -> tuple[float, int, float] | None:
    """``(sm_mhz, reasons, power_w)`` from one line of ``nvidia-smi --query-gpu=`` :data:`QUERY`
    ``--format=csv,noheader,nounits`` (e.g. ``1980, 0x0000000000000004, 436.29``); None for a
    line that is not such a sample (a message, a truncated line)."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 3:
        return None
    try:
        reasons = int(fields[1], 16)
    except ValueError:
        return None
    return _number(fields[0]), reasons, _number(fields[2])


def summarise(samples: list[tuple[float, int, float]]) -> dict:
    """The :mod:`tflabench.run.gpu_trace` columns of parsed samples (the module docstring)."""
    if not samples:
        return {"gpu_sm_mhz_min": None, "gpu_power_w_max": None, "gpu_slowdowns": None}
    busy = [mhz for mhz, reasons, _ in samples if not reasons & IDLE and not math.isnan(mhz)]
    power = [w for _, _, w in samples if not math.isnan(w)]
    seen = 0
    for _, reasons, _ in samples:
        seen |= reasons
    return {
        "gpu_sm_mhz_min": min(busy) if busy else None,
        "gpu_power_w_max": max(power) if power else None,
        "gpu_slowdowns": ",".join(name for bit, name in SLOWDOWNS.items() if seen & bit),
    }


@functools.lru_cache(maxsize=None)
def power_field(gpu: str, command: str = "nvidia-smi") -> str:
    """The first of :data:`POWER_FIELDS` that ``nvidia-smi`` answers with a number for this GPU
    (one query each, once per process); the last where none does."""
    for field in POWER_FIELDS[:-1]:
        try:
            proc = subprocess.run([command, "-i", str(gpu), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            break
        if proc.returncode == 0 and not math.isnan(_number(proc.stdout.strip())):
            return field
    return POWER_FIELDS[-1]


def _die_with_parent() -> None:
    """In the child, before ``nvidia-smi`` starts (Linux): have the kernel send it SIGTERM when
    the process that started it dies (``prctl(PR_SET_PDEATHSIG)``), so that a worker killed
    at its timeout leaves no sampler behind, even one that outlives its closed pipe."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class GpuTrace:
    """``nvidia-smi`` sampling one GPU in the background; use as a context manager.

    Args:
        gpu: the GPU as ``nvidia-smi -i`` takes it: ``GPU-<uuid>`` (what the harness passes,
            :func:`tflabench.run.measure.nvidia_smi_id`) or an index in nvidia-smi's order.
        period_ms: milliseconds between samples.
        command: the ``nvidia-smi`` executable.

    Starting never raises: without ``nvidia-smi`` (or when it exits at once) there are no
    samples and :meth:`columns` gives None columns.
    """

    def __init__(self, gpu: str, period_ms: int = PERIOD_MS, command: str = "nvidia-smi"):
        self.power = power_field(str(gpu), command)
        self.argv = [command, "-i", str(gpu), f"--query-gpu={QUERY},{self.power}",
                     "--format=csv,noheader,nounits", "-lms", str(period_ms)]
        self.period_s = period_ms / 1e3
        self._samples: list[tuple[float, tuple[float, int, float]]] = []
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> GpuTrace:
        try:
            self._process = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                text=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        except (OSError, subprocess.SubprocessError):
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        """Collect ``(arrival time, sample)`` pairs until the process ends."""
        for line in self._process.stdout:
            sample = parse_sample(line)
            if sample is not None:
                with self._lock:
                    self._samples.append((time.monotonic(), sample))

    def wait_first(self, timeout_s: float = 3.0) -> None:
        """Block until the first sample arrived (``nvidia-smi`` takes a moment to start), the
        process ended, or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._process is not None and self._process.poll() is None:
            with self._lock:
                if self._samples:
                    return
            time.sleep(0.01)

    def columns(self, start: float, end: float) -> dict:
        """The columns of the samples that arrived from ``start`` to one period after ``end``
        (``time.monotonic()`` seconds; a sample tells of the moment before it arrived); waits
        for that period to pass while ``nvidia-smi`` runs."""
        wait = end + self.period_s - time.monotonic()
        if wait > 0 and self._process is not None and self._process.poll() is None:
            time.sleep(wait)
        with self._lock:
            taken = [s for t, s in self._samples if start <= t <= end + self.period_s]
        return summarise(taken)

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._process.stdout.close()


__all__ = ["GpuTrace", "parse_sample", "power_field", "summarise", "SLOWDOWNS", "IDLE", "PERIOD_MS", "QUERY",
           "POWER_FIELDS"]
