"""The environment a run happens in: what every result set records and ``doctor`` checks.

:func:`collect` gives the metadata fields (GPU name and count, driver, CUDA, torch, triton,
python, peers' versions, git revision, a hash of the measured sources, hostname, CPU model,
tflabench version) without creating a CUDA context in the calling process (``nvidia-smi``
first; torch's device query only as a fallback), so that the runner's parent process leaves
the GPU to its workers.
:func:`known_problems` lists known-bad combinations (seen on an H200 with triton 3.6).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import platform
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tflabench import __version__

#: Peer distributions whose versions are recorded: distribution name -> import name.
PEERS: dict[str, str] = {
    "mlstm_kernels": "mlstm_kernels",
    "fla-core": "fla",
    "flash-linear-attention": "fla",
    "mamba_ssm": "mamba_ssm",
    "causal-conv1d": "causal_conv1d",
    "flash_attn": "flash_attn",
    "flash_attn_3": "flash_attn_interface",
    "fa3_fwd": "fa3_fwd_interface",
    "flash-attn-4": "flash_attn.cute",
    "lightning-attn": "lightning_attn",
}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def peer_versions() -> dict[str, str]:
    """Installed peer distributions -> version (only those installed)."""
    out = {}
    for dist in PEERS:
        v = _version(dist)
        if v is not None:
            out[dist] = v
    return out


def git_revision(path: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding tflabench (``+dirty`` when the
    working tree has changes to tracked files); None outside a git checkout.

    A copied tree without ``.git`` (a remote GPU machine, a container) can name its
    revision in the environment variable ``TFLABENCH_GIT_REVISION``."""
    if os.environ.get("TFLABENCH_GIT_REVISION"):
        return os.environ["TFLABENCH_GIT_REVISION"]
    root = Path(path) if path else Path(__file__).resolve().parent.parent
    if shutil.which("git") is None:
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def commit_date(revision: str | None, path: str | Path | None = None) -> str | None:
    """The committer date (ISO 8601) of ``revision`` (``+dirty`` ignored) in the checkout
    holding tflabench (or ``path``); None where git, the checkout or the commit is absent
    (a shallow clone lacks older commits). ``tflabench history`` orders result sets by it
    (docs/ci.md, "History")."""
    if not revision or revision.startswith("-") or shutil.which("git") is None:
        return None
    root = Path(path) if path else Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "-C", str(root), "show", "-s", "--format=%cI",
                               revision.removesuffix("+dirty"), "--"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    return text.splitlines()[0] if done.returncode == 0 and text else None


def sources_sha256(roots: list[str | Path] | None = None) -> str | None:
    """SHA-256 (hex) of the measured code itself: every ``.py`` file under ``roots``
    (default: the ``tflabench`` package and the ``tfla`` kernels it imports), by relative
    path and bytes, in sorted order. It names what ran where ``git_revision`` cannot: a
    copied tree whose git metadata is older than its files reads ``<older commit>+dirty``.
    None where no root can be found."""
    import hashlib

    if roots is None:
        roots = [Path(__file__).resolve().parent]
        spec = importlib.util.find_spec("tfla")
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).resolve().parent)
    digest = hashlib.sha256()
    found = False
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            found = True
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}\n".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest() if found else None


@dataclasses.dataclass(frozen=True)
class GpuDevice:
    """One GPU: ``index`` as ``nvidia-smi`` numbers it on the host (the value
    ``CUDA_VISIBLE_DEVICES`` takes), ``name`` its model (``NVIDIA H200``), ``uuid``
    (``GPU-...``; None where only torch was asked)."""

    index: str
    name: str
    uuid: str | None = None

    def as_dict(self) -> dict:
        """``{"index", "name"}``: an entry of the metadata's ``gpus_used``."""
        return {"index": self.index, "name": self.name}


@dataclasses.dataclass
class GpuInfo:
    """What is known about the GPUs: ``devices`` (every GPU of the host from ``nvidia-smi``,
    or those torch sees), driver version, and ``source`` (``nvidia-smi``, ``torch`` or
    None when there is no GPU)."""

    devices: list[GpuDevice]
    driver: str | None
    source: str | None = None

    @property
    def names(self) -> list[str]:
        """The model name of each GPU, in index order."""
        return [d.name for d in self.devices]


#: Paths that exist where a GPU driver is loaded (NVIDIA's; AMD's ROCm for a ROCm build of torch).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")


def gpu_driver_present() -> bool:
    """Whether this machine has a GPU driver loaded (:data:`DRIVER_PATHS`), known without
    importing torch or starting CUDA."""
    return any(os.path.exists(p) for p in DRIVER_PATHS)


def gpu_info() -> GpuInfo:
    """GPUs and driver from ``nvidia-smi`` (no CUDA context here; every GPU of the host,
    whatever ``CUDA_VISIBLE_DEVICES`` says); falls back to torch (which creates a context
    and sees only the visible GPUs) when ``nvidia-smi`` is absent but a driver is loaded
    (:func:`gpu_driver_present`). Empty on a CPU machine, found without importing torch."""
    if shutil.which("nvidia-smi"):
        try:
            res = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30)
            if res.returncode == 0:
                rows = [[c.strip() for c in r.split(",")] for r in res.stdout.strip().splitlines() if r.strip()]
                devices = [GpuDevice(r[0], r[2], r[1] or None) for r in rows if len(r) >= 3]
                driver = rows[0][3] if rows and len(rows[0]) > 3 else None
                return GpuInfo(devices, driver, "nvidia-smi")
        except (OSError, subprocess.TimeoutExpired):
            pass
    if not gpu_driver_present():  # no driver: no GPU, and no need to import torch (seconds) to learn it
        return GpuInfo([], None, None)
    try:
        import torch

        if torch.cuda.is_available():
            # torch numbers the visible GPUs from 0; name each as CUDA_VISIBLE_DEVICES does
            entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
            devices = [GpuDevice(entries[i] if i < len(entries) else str(i), torch.cuda.get_device_name(i))
                       for i in range(torch.cuda.device_count())]
            return GpuInfo(devices, None, "torch")
    except Exception:  # pragma: no cover - broken CUDA setups
        pass
    return GpuInfo([], None, None)


def visible_gpus(info: GpuInfo | None = None, cuda_visible_devices: str | None = None) -> list[GpuDevice]:
    """The GPUs a process started here may use, in the order CUDA numbers them: those
    ``CUDA_VISIBLE_DEVICES`` names (indices or ``GPU-`` UUID prefixes; like CUDA, the list
    ends at the first entry that names no GPU), every GPU when it is unset.

    Args:
        info: :func:`gpu_info` (queried when None).
        cuda_visible_devices: the variable's value (default: this process's environment).
    """
    info = gpu_info() if info is None else info
    text = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible_devices is None else cuda_visible_devices
    if text is None or info.source != "nvidia-smi":  # torch already applied the variable
        return list(info.devices)
    chosen: list[GpuDevice] = []
    for entry in (e.strip() for e in text.split(",")):
        match = [d for d in info.devices
                 if entry == d.index or (entry.startswith("GPU-") and d.uuid and d.uuid.startswith(entry))]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def gpus_used(slots: list[str] | None, info: GpuInfo | None = None) -> list[dict]:
    """The metadata's ``gpus_used``: ``{"index", "name"}`` of each GPU a run's workers use:
    one per ``--gpus`` slot (its ``CUDA_VISIBLE_DEVICES`` value), or, without slots, the
    first visible GPU (where an unpinned worker runs). A slot naming no GPU of this host
    is listed with name None. Empty without GPUs."""
    info = gpu_info() if info is None else info
    if not slots:
        visible = visible_gpus(info)
        return [visible[0].as_dict()] if visible else []
    out = []
    for slot in slots:
        found = visible_gpus(info, slot)
        out.append(found[0].as_dict() if found else {"index": str(slot), "name": None})
    return out


def cpu_name() -> str | None:
    """The CPU model (``model name`` of ``/proc/cpuinfo`` on Linux, else
    ``platform.processor()``), or None when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def collect() -> dict:
    """The environment part of ``metadata.json``: ``gpu_name`` (the first GPU this process
    may use, None on CPU), ``gpu_count`` (how many it may use: ``CUDA_VISIBLE_DEVICES``
    applies), ``driver``, ``cuda`` (torch's CUDA build), ``torch``, ``triton``,
    ``python``, ``peers`` (name -> version), ``git_revision``, ``git_commit_date``
    (:func:`commit_date`; a tree without ``.git`` names it in ``TFLABENCH_GIT_COMMIT_DATE``),
    ``sources_sha256``
    (:func:`sources_sha256`), ``hostname``, ``cpu``
    (:func:`cpu_name`), ``tflabench``.
    Imports torch (not CUDA-initialising)."""
    info = gpu_info()
    visible = visible_gpus(info)
    try:
        import torch

        torch_version, cuda = torch.__version__, torch.version.cuda
    except ImportError:  # pragma: no cover
        torch_version, cuda = None, None
    revision = git_revision()
    return {
        "gpu_name": visible[0].name if visible else None,
        "gpu_count": len(visible),
        "driver": info.driver,
        "cuda": cuda,
        "torch": torch_version,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "peers": peer_versions(),
        "git_revision": revision,
        "git_commit_date": os.environ.get("TFLABENCH_GIT_COMMIT_DATE") or commit_date(revision),
        "sources_sha256": sources_sha256(),
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "tflabench": __version__,
    }


def _parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def is_hopper(gpu_name: str | None) -> bool:
    """True for Hopper GPUs (H100, H200, H20, H800, GH200) by device name."""
    if not gpu_name:
        return False
    s = gpu_name.lower()
    return any(tag in s for tag in ("h100", "h200", "h800", "h20", "gh200"))


#: Environment variable that narrows fla's #640 guard (:func:`fla_640_guard_narrowed`).
FLA_640_GUARD_ENV = "TFLABENCH_FLA_640_GUARD"


def fla_640_guard_narrowed() -> bool:
    """Whether ``TFLABENCH_FLA_640_GUARD=narrow``: let fla's ``chunk_simple_gla`` gated
    backward run on Hopper with 3.4.0 <= triton < 3.7.1 where its key block width is not 64.

    Why that is safe to try: fla issue #640's bisection on Hopper found the miscompiled
    ``chunk_bwd_dqkwg`` wrong at BK = 64 only (BK 32 and 128 within tolerance); the guard
    fla-core 0.6.0 raises covers every BK (unsloth-zoo narrowed it the same way, PR #1010).
    The Figure-4 layout (d_qk 128) and Figure 12's (d_qk 256) run BK = 128. The numerics gate
    still checks every gradient (dq, dk, dv, dg) against the float64 reference at the same
    d_qk, so a wrong backward becomes a ``wrong`` row, never a timing. Off by default: fla's
    guard stands. The backend acts on it (``tflabench.backends.fla``); ``doctor`` reports it."""
    return os.environ.get(FLA_640_GUARD_ENV, "").strip().lower() == "narrow"


def fla_640_refused(hopper: bool | None, triton: tuple[int, ...] | None) -> bool:
    """fla's #640 rule, its one home here: fla-core 0.6.0 refuses the gated backward of
    ``chunk_simple_gla`` (``chunk_bwd_dqkwg``) on a Hopper GPU with 3.4.0 <= triton < 3.7.1
    (fla/ops/common/chunk_o.py; fla issue #640). ``triton``: the version as a tuple
    (:func:`_parse_version`), None when triton is absent."""
    return bool(hopper) and triton is not None and (3, 4) <= tuple(triton) < (3, 7, 1)


#: The command that installs CPU-only torch from PyTorch's own index (an extra cannot pin an index).
CPU_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def known_problems(env: dict) -> list[str]:
    """Known-bad combinations in ``env`` (as :func:`collect` returns it), one advice line
    each (measured on an H200 with triton 3.6)."""
    problems = []
    triton = _parse_version(env.get("triton"))
    peers = env.get("peers") or {}
    hopper = is_hopper(env.get("gpu_name"))
    fla = peers.get("fla-core") or peers.get("flash-linear-attention")
    refused = bool(fla) and fla_640_refused(hopper, triton)
    if refused and fla_640_guard_narrowed():
        problems.append(
            f"fla {fla} on triton {env.get('triton')} on Hopper: fla's #640 guard is narrowed "
            f"({FLA_640_GUARD_ENV}=narrow): chunk_simple_gla's gated backward runs where fla's key "
            "block width is not 64 and stays refused at 64; the numerics gate checks its gradients.")
    elif refused:
        problems.append(
            f"fla {fla} on triton {env.get('triton')} on Hopper: the gated backward of "
            "chunk_simple_gla (chunk_bwd_dqkwg) refuses to run (fla issue #640: Triton 3.4-3.7.0 "
            "miscompiles it on Hopper); its fwdbw rows will be unavailable (chunk_gla's backward "
            f"is not guarded). Fix: triton >= 3.7.1, or {FLA_640_GUARD_ENV}=narrow (key block width "
            "not 64, gradients checked by the numerics gate).")
    if peers.get("mamba_ssm") and importlib.util.find_spec("selective_scan_cuda") is None:
        problems.append(
            f"mamba_ssm {peers['mamba_ssm']} has no compiled selective_scan_cuda: Mamba (v1) is "
            "unavailable; the Mamba 2 SSD Triton kernel still runs. Fix: install the mamba_ssm wheel "
            "that benchmarks/build_peer_wheel.sh mamba builds with its CUDA extension (docs/offline-peers.md).")
    if env.get("gpu_count", 0) == 0:
        problems.append("no GPU visible: only the CPU suite (suites/cpu_demo.yaml) can run; "
                        "GPU suites need a CUDA build of torch and an NVIDIA driver.")
        if env.get("cuda"):
            problems.append(
                f"torch {env.get('torch')} is a CUDA build (CUDA {env['cuda']}) on a machine without a GPU: "
                "it runs on the CPU, but its nvidia-* packages are gigabytes unused. CPU-only torch: "
                f"{CPU_TORCH_INSTALL} (README, Set-up).")
    return problems


def python_executable() -> str:
    """The interpreter running tflabench (shown by ``doctor``)."""
    return sys.executable
