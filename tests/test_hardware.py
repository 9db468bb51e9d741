"""GPU catalogue, measured ceilings, detection and user YAML files (tflabench.hardware).

Sources of the expected values: the paper's Table 18 and docs/model-counts.md §5 (I10: exact
alpha/beta), the measured H200 ceilings of one calibration (772 TFLOP/s, 4.24 TB/s;
docs/model.md, "Hardware").
"""

from __future__ import annotations

import math

import pytest

from tflabench import hardware
from tflabench.errors import UserError
from tflabench.hardware import detect_gpu, get_gpu, list_gpus, save_measured


pytestmark = pytest.mark.usefixtures("isolated_user_files")   # tests/conftest.py


def test_table_18_ceilings_and_exact_intensities_I10():
    # paper Table 18; §3 I10: exact alpha/beta = 133.333, 161.240, 295.224, 292.208
    expect = {"v100": (120e12, 0.9e12, 133.333), "a100": (312e12, 1.935e12, 161.240),
              "h100": (989e12, 3.35e12, 295.224), "b200": (2250e12, 7.7e12, 292.208)}
    for key, (alpha, beta, I) in expect.items():
        g = get_gpu(key)
        assert (g.flops_per_s, g.bytes_per_s) == (alpha, beta)
        assert abs(g.intensity_flop_per_byte - I) < 5e-4
        assert "Table 18" in g.source


def test_catalogue_has_the_extra_gpus_with_sources():
    keys = {g.key for g in list_gpus()}
    assert {"v100", "a100", "h100", "b200", "h100_pcie", "h200", "gb200", "mi300x"} <= keys
    for g in list_gpus():
        assert g.flops_per_s > 0 and g.bytes_per_s > 0 and g.source
    # H200 datasheet (docs/model-counts.md §5): 989e12 dense bf16, 4.8e12 B/s, I_acc 206.042
    assert abs(get_gpu("h200").intensity_flop_per_byte - 206.042) < 5e-4


def test_h200_measured_ceilings_and_ceiling_choice():
    m = get_gpu("h200", ceilings="measured")
    assert (m.flops_per_s, m.bytes_per_s) == (772e12, 4.24e12)
    assert m.ceilings == "measured" and "2026-11-22" in m.ceilings_source and "torch 2.11" in m.ceilings_source
    d = get_gpu("h200", ceilings="datasheet")
    assert d.flops_per_s == 989e12 and d.ceilings_source == d.source


def test_names_and_aliases_resolve_case_and_punctuation_insensitively():
    assert get_gpu("H100").key == "h100"
    assert get_gpu("H100 SXM").key == "h100"
    assert get_gpu("h100-pcie").key == "h100_pcie"
    assert get_gpu("MI300X").key == "mi300x"


def test_unknown_gpu_is_a_user_error_listing_the_known_ones():
    with pytest.raises(UserError) as exc:
        get_gpu("tpu-v5")
    msg = str(exc.value)
    assert "tpu-v5" in msg and "h100" in msg and "mi300x" in msg and "\n" not in msg


def test_measured_asked_but_absent_says_run_calibrate():
    with pytest.raises(UserError, match="tflabench calibrate"):
        get_gpu("h100", ceilings="measured")
    with pytest.raises(UserError, match="ceilings"):
        get_gpu("h100", ceilings="peak")


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100_pcie"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA B200", "b200"),
    ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA H100 NVL", None),  # other ceilings than H100 SXM: unknown rather than wrong
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
])
def test_detect_gpu_maps_torch_device_names(name, key):
    assert detect_gpu(name) == key


def test_user_yaml_adds_and_overrides_gpus(tmp_path):
    f = tmp_path / "gpus.yaml"
    f.write_text(
        "gpus:\n"
        "  l40s:\n"
        "    name: NVIDIA L40S\n"
        "    flops_per_s: 362e12\n"  # YAML 1.1 reads this as a string: must be accepted
        "    bytes_per_s: 8.64e+11\n"
        "    source: NVIDIA L40S datasheet\n"
        "    match: [L40S]\n"
        "  h100:\n"
        "    measured: {flops_per_s: 7.0e+14, bytes_per_s: 3.0e+12, note: my run}\n"
    )
    g = get_gpu("l40s", hardware_file=f)
    assert (g.flops_per_s, g.bytes_per_s, g.source) == (362e12, 8.64e11, "NVIDIA L40S datasheet")
    assert detect_gpu("NVIDIA L40S", hardware_file=f) == "l40s"
    h = get_gpu("h100", ceilings="measured", hardware_file=f)
    assert (h.flops_per_s, h.bytes_per_s, h.measured_note) == (7.0e14, 3.0e12, "my run")
    assert get_gpu("h100", hardware_file=f).flops_per_s == 989e12  # datasheet kept


def test_environment_variable_and_default_file_are_read(tmp_path, monkeypatch):
    f = tmp_path / "env.yaml"
    f.write_text("gpus:\n  mygpu: {flops_per_s: 1.0e+14, bytes_per_s: 1.0e+12}\n")
    monkeypatch.setenv("TFLABENCH_HARDWARE", str(f))
    assert get_gpu("mygpu").intensity_flop_per_byte == 100.0
    monkeypatch.delenv("TFLABENCH_HARDWARE")
    with pytest.raises(UserError):
        get_gpu("mygpu")
    default = tmp_path / "home" / ".config" / "tflabench" / "gpus.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(f.read_text())
    assert get_gpu("mygpu").flops_per_s == 1e14


@pytest.mark.parametrize("text,match", [
    ("gpus: [unclosed\n", "YAML syntax error"),
    # the strict reader of every user YAML file: a repeated key, an alias bomb
    ("gpus:\n  x: {flops_per_s: 1.0e+12, bytes_per_s: 1.0e+12, flops_per_s: 9.0e+15}\n",
     "key 'flops_per_s' appears twice"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\ngpus: {}\n", "expands to more than"),
    ("- just\n- a list\n", "mapping"),
    ("gpus:\n  x: {flops_per_s: fast, bytes_per_s: 1.0e+12}\n", "flops_per_s"),
    ("gpus:\n  x: {flops_per_s: 1.0e+12}\n", "bytes_per_s"),
    ("gpus:\n  h100: {speed: 3}\n", "speed"),
    ("gpus:\n  h100: {measured: {flops_per_s: -1, bytes_per_s: 1.0e+12}}\n", "measured.flops_per_s"),
    ("gpus:\n  ../../x: {flops_per_s: 1.0e+12, bytes_per_s: 1.0e+12}\n", "key '../../x' contains a path separator"),
    # the GPUs without their top-level key: refused, not silently ignored
    ("h200:\n  measured: {flops_per_s: 7.0e+14, bytes_per_s: 4.0e+12}\n",
     "'h200' is not a known top-level key \\(allowed: gpus\\); its GPUs go under a top-level 'gpus:' key"),
    ("gpus: {}\nextra: 1\n", "'extra' is not a known top-level key"),
])
def test_invalid_hardware_file_is_a_one_line_user_error(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UserError, match=match) as exc:
        get_gpu("h100", hardware_file=f)
    assert str(f) in str(exc.value) and "\n" not in str(exc.value)


def test_missing_or_unreadable_explicit_file_is_a_user_error(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        get_gpu("h100", hardware_file=tmp_path / "nope.yaml")
    monkeypatch.setenv("TFLABENCH_HARDWARE", str(tmp_path / "nope.yaml"))
    with pytest.raises(UserError, match="does not exist"):
        get_gpu("h100")
    monkeypatch.delenv("TFLABENCH_HARDWARE")
    with pytest.raises(UserError, match="is a directory"):
        get_gpu("h100", hardware_file=tmp_path)  # a directory


def test_save_measured_writes_yaml_that_get_gpu_reads_back_keeping_other_entries(tmp_path):
    f = tmp_path / "sub" / "gpus.yaml"
    f.parent.mkdir()
    f.write_text("gpus:\n  mygpu: {flops_per_s: 1.0e+14, bytes_per_s: 1.0e+12}\n")
    out = save_measured("h100", 7.5e14, 3.1e12, "calibrate 2026-11-22", path=f)
    assert out == f
    g = get_gpu("h100", ceilings="measured", hardware_file=f)
    assert (g.flops_per_s, g.bytes_per_s, g.measured_note) == (7.5e14, 3.1e12, "calibrate 2026-11-22")
    assert get_gpu("mygpu", hardware_file=f).flops_per_s == 1e14
    # a second save replaces the measured values
    save_measured("h100", 8e14, 3.2e12, "again", path=f)
    assert get_gpu("h100", ceilings="measured", hardware_file=f).flops_per_s == 8e14


def test_save_measured_defaults_to_the_user_config_file_and_rejects_bad_values(tmp_path):
    out = save_measured("h200", 7.8e14, 4.3e12, "note")
    assert out == tmp_path / "home" / ".config" / "tflabench" / "gpus.yaml"
    assert get_gpu("h200", ceilings="measured").flops_per_s == 7.8e14
    with pytest.raises(UserError):
        save_measured("h200", 0, 4.3e12, "note")
    with pytest.raises(UserError):
        save_measured("h200", math.nan, 4.3e12, "note")


def test_unknown_gpu_with_only_measured_ceilings_needs_measured(tmp_path):
    f = tmp_path / "g.yaml"
    save_measured("newchip", 5e14, 2e12, "measured only", path=f)
    assert get_gpu("newchip", ceilings="measured", hardware_file=f).flops_per_s == 5e14
    with pytest.raises(UserError, match="no datasheet ceilings"):
        get_gpu("newchip", hardware_file=f)
    # the catalogue listing shows it with its measured ceilings
    assert {g.key: g.ceilings for g in list_gpus(hardware_file=f)}["newchip"] == "measured"


def test_hardware_module_imports_without_yaml_until_a_file_is_read():
    import subprocess
    import sys

    code = ("import sys; import tflabench.hardware as h; h.get_gpu('h100'); "
            "print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"HOME": "/nonexistent", "PATH": ""}, check=True)
    assert out.stdout.strip() == "False"
    assert hardware.DEFAULT_FILE.name == "gpus.yaml"
