"""benchmarks/wheelhouse_install.sh on the CPU: a made-up wheel split into parts (as
wheelhouse_prepare.sh --split-mb writes them), joined from two folders, checked against its
sha256 and installed without the package index; a damaged part stops it before installing."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "benchmarks" / "wheelhouse_install.sh"
NAME = "tinypeer-0.1-py3-none-any.whl"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("xz") is None,
                                reason="needs bash and xz")


def _wheel_files() -> dict[str, bytes]:
    files = {
        "tinypeer/__init__.py": b"VALUE = 42\n" + b"# padding\n" * 3000,
        "tinypeer-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypeer\nVersion: 0.1\n",
        "tinypeer-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{k},,\n" for k in files) + "tinypeer-0.1.dist-info/RECORD,,\n"
    files["tinypeer-0.1.dist-info/RECORD"] = record.encode()
    return files


def _wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:   # stored: large enough to split
        for name, data in _wheel_files().items():
            z.writestr(name, data)
    return buf.getvalue()


def _split(data: bytes, name: str, folders: list[Path], n: int = 3) -> None:
    """Parts name.part-aa, -ab, ... spread over ``folders``, and name.sha256 in the first."""
    size = -(-len(data) // n)
    for i in range(n):
        folder = folders[i % len(folders)]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.part-a{chr(ord('a') + i)}").write_bytes(data[i * size:(i + 1) * size])
    (folders[0] / f"{name}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def _install(tmp_path, *houses):
    target = tmp_path / "site"
    return target, subprocess.run(["bash", str(INSTALL), "--target", str(target), *map(str, houses)],
                                  capture_output=True, text=True, timeout=120,
                                  env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)})


def test_parts_from_two_folders_are_joined_checked_and_installed(tmp_path):
    _split(_wheel_bytes(), NAME, [tmp_path / "first", tmp_path / "second"])
    target, proc = _install(tmp_path, tmp_path / "first", tmp_path / "second")
    assert proc.returncode == 0, proc.stderr
    assert f"joined {NAME} from 3 parts, sha256 ok" in proc.stdout
    assert "nvidia_cutlass_dsl/dsl_packages" in proc.stdout          # the PYTHONPATH it prints
    assert (target / "tinypeer" / "__init__.py").read_bytes().startswith(b"VALUE = 42")


def test_a_repacked_xz_wheel_is_rebuilt_and_installed(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in _wheel_files().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _split(buf.getvalue(), NAME + ".tar.xz", [tmp_path / "parts"], n=2)
    target, proc = _install(tmp_path, tmp_path / "parts")
    assert proc.returncode == 0, proc.stderr
    assert (target / "tinypeer" / "__init__.py").is_file()


def test_a_damaged_part_stops_the_install_before_anything_is_installed(tmp_path):
    data = _wheel_bytes()
    _split(data, NAME, [tmp_path / "parts"])
    part = tmp_path / "parts" / f"{NAME}.part-ab"
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    target, proc = _install(tmp_path, tmp_path / "parts")
    assert proc.returncode == 1
    assert NAME in proc.stderr and "expected " + hashlib.sha256(data).hexdigest() in proc.stderr
    assert not target.exists()
    (tmp_path / "parts" / f"{NAME}.part-ab").unlink()                # a missing part: same verdict
    assert _install(tmp_path, tmp_path / "parts")[1].returncode == 1


def test_bad_arguments_say_what_is_wrong_in_one_line(tmp_path):
    proc = subprocess.run(["bash", str(INSTALL), str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("is not a folder")
