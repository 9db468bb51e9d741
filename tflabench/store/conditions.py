"""The timing method of a result set: which timer measured its cases, with how many
threads per worker, on which CPU model and host (docs/harness.md, "CPU threads: workers
share the cores").

These are measurement conditions like the suite's ``timing`` fields: two sets timed by
different timers hold numbers of different kinds (process CPU time against wall time),
so ``compare`` holds their cases undecided, and ``--resume`` and ``merge`` can refuse
to join them. One reading, :func:`timing_method`, serves all three.
"""

from __future__ import annotations

from typing import Any, Mapping

#: The CPU timers: a worker with one CPU thread is timed by its process CPU time, which a
#: busy machine does not inflate (time spent waiting for a core is not counted); a worker
#: with a wider thread pool by wall time (its threads' CPU times would add up).
CPU_TIMERS = {"process_time": "process CPU time (one thread per worker)",
              "perf_counter": "wall time (time.perf_counter)"}

#: The GPU timers: CUDA events around each call, or around replays of one captured graph.
GPU_TIMERS = {"cuda_events": "CUDA events around each call",
              "cuda_graph": "CUDA events around replays of one captured CUDA graph"}

#: The fields of :func:`timing_method`, in the order they are reported.
TIMING_CONDITIONS = ("timer", "threads", "cpu", "hostname")


def cpu_timer(threads: int) -> str:
    """The name of the CPU timer (:data:`CPU_TIMERS`) for a worker of ``threads`` threads."""
    return "process_time" if threads == 1 else "perf_counter"


def _device(metadata: Mapping[str, Any]) -> str | None:
    measurement = metadata.get("measurement")
    device = measurement.get("device") if isinstance(measurement, Mapping) else None
    device = device or metadata.get("device")
    return str(device) if isinstance(device, str) and device else None


def timing_method(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The timing method a result set records (``metadata.json``), one value per
    :data:`TIMING_CONDITIONS` field, None where the set does not say.

    ``timer``: on the CPU :func:`cpu_timer` of ``cpu_threads.per_worker``; on CUDA
    ``cuda_graph`` where ``measurement.timing.cuda_graph`` is set, else ``cuda_events``.
    ``threads``: ``cpu_threads.per_worker`` (CPU sets only: a GPU kernel's time does not
    depend on the host's thread pools). ``cpu``, ``hostname``: as recorded.
    """
    metadata = metadata if isinstance(metadata, Mapping) else {}
    device = _device(metadata)
    threads_record = metadata.get("cpu_threads")
    per_worker = threads_record.get("per_worker") if isinstance(threads_record, Mapping) else None
    per_worker = per_worker if isinstance(per_worker, int) and not isinstance(per_worker, bool) else None
    timer = threads = None
    if device == "cpu":
        threads = per_worker
        timer = cpu_timer(per_worker) if per_worker is not None else None
    elif device is not None and device.startswith("cuda"):
        measurement = metadata.get("measurement")
        timing = measurement.get("timing") if isinstance(measurement, Mapping) else None
        graph = isinstance(timing, Mapping) and timing.get("cuda_graph") is True
        timer = "cuda_graph" if graph else "cuda_events"

    def text(key: str) -> str | None:
        value = metadata.get(key)
        return value if isinstance(value, str) and value else None

    return {"timer": timer, "threads": threads, "cpu": text("cpu"), "hostname": text("hostname")}


def timing_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, old value, new value)`` for each :data:`TIMING_CONDITIONS` field that both
    result sets' metadata record and that differs (:func:`timing_method`); in that order."""
    a, b = timing_method(old), timing_method(new)
    return [(key, a[key], b[key]) for key in TIMING_CONDITIONS
            if a[key] is not None and b[key] is not None and a[key] != b[key]]


def join_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """The :func:`timing_differences` that forbid the rows of two result sets to share one
    set (``run --resume``, ``merge``): on the CPU every :data:`TIMING_CONDITIONS` field (the
    CPU and its host are the device, the thread count picks the timer); on a GPU the timer
    only (shards of one GPU run may run on several hosts, ``merge`` records each). A set
    measured on the CPU by either side counts as a CPU set. ``(field, old, new)``, in the
    order of :data:`TIMING_CONDITIONS`. Source: docs/result-sets.md, "One timing method
    per set"."""
    cpu = timing_method(old)["timer"] in CPU_TIMERS or timing_method(new)["timer"] in CPU_TIMERS
    return [d for d in timing_differences(old, new) if cpu or d[0] == "timer"]


#: How each :data:`TIMING_CONDITIONS` field is named in a refusal of ``--resume`` or ``merge``.
TIMING_FIELD_NAMES = {"timer": "timer", "threads": "CPU threads per worker (cpu_threads.per_worker)",
                      "cpu": "CPU model (cpu)", "hostname": "host (hostname)"}
