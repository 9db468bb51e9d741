"""What the command line prints where there is no terminal (a file, a CI log), and how its
help reads: every table column kept, plain metavars, nothing cut."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tflabench.cli import app
from tflabench.store.results import write_results

ROOT = Path(__file__).resolve().parents[1]


def _rows(seed: int, factor: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for seq_len in (512, 1024):
        samples = 0.1 * factor * seq_len / 512 * (1 + 0.01 * rng.standard_normal(20))
        rows.append(dict(
            suite="out_demo", kernel="a kernel with a long label, as suites have them", backend="tfla",
            family="mlstm", params={}, mode="fwd", dtype="bfloat16", device="cuda", batch=1, seq_len=seq_len,
            heads=8, d_qk=256, d_hv=512, chunk_size=64, embedding_dim=4096, status="ok",
            ms_median=float(np.median(samples)), ms_q25=float(np.quantile(samples, 0.25)),
            ms_q75=float(np.quantile(samples, 0.75)), ms_samples=[float(x) for x in samples], n_iter=20,
            peak_mem_bytes=64 * 2**20))
    return rows


def test_compare_redirected_to_a_file_keeps_every_column(tmp_path):
    meta = dict(suite="out_demo", gpu_name="NVIDIA H200", torch="2.13.0", triton="3.6.0")
    write_results(tmp_path / "a", _rows(1), meta)
    write_results(tmp_path / "b", _rows(2, factor=1.3), meta)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), env.get("PYTHONPATH", "")])
    log = tmp_path / "log.txt"
    with open(log, "w") as handle:  # a real file: no terminal, no COLUMNS
        done = subprocess.run([sys.executable, "-m", "tflabench", "compare", str(tmp_path / "a"),
                               str(tmp_path / "b")], stdout=handle, stderr=subprocess.PIPE, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    text = log.read_text()
    header = next(line for line in text.splitlines() if "outcome" in line and "case" in line)
    for column in ("outcome", "case", "status", "base ms", "new ms", "time", "p", "resolution", "memory"):
        assert f" {column} " in header, (column, header)
    for column in ("backend", "cases", "speed-up", "slower", "faster", "undecided", "failures"):
        assert column in text
    assert "…" not in text  # no cell cut short
    rows = [line for line in text.splitlines() if line.startswith("│ regression")]
    assert len(rows) == 2 and all("a kernel with a long label, as suites have them" in r for r in rows)


def _commands():
    group = get_command(app)
    return sorted(group.commands)


def test_help_of_every_command_reads_plainly_and_is_not_cut():
    runner = CliRunner()
    group = get_command(app)
    for name in _commands():
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        text = result.output
        for python_type in ("<bool>", "<list", "<path>", "<int", "<str>", "<float>", "{"):
            assert python_type not in text, (name, python_type)
        assert "…" not in text, name
        for param in group.commands[name].params:
            for opt in param.opts + param.secondary_opts:
                if opt.startswith("--"):
                    assert opt in text, (name, opt)


def test_an_option_has_the_same_short_name_in_every_command_that_takes_it():
    """One convention per concept: where one command gives a long option a short name
    (``--seq-len`` / ``-T``), every command with that option gives it the same one."""
    shorts: dict[str, dict[str, frozenset]] = {}
    for name, cmd in get_command(app).commands.items():
        for p in cmd.params:
            opts = [*p.opts, *p.secondary_opts]
            for long in (o for o in opts if o.startswith("--")):
                shorts.setdefault(long, {})[name] = frozenset(o for o in opts if not o.startswith("--"))
    checked = 0
    for long, by_command in shorts.items():
        names = set(by_command.values())
        if any(names - {frozenset()}):
            checked += 1
            assert len(names) == 1, (long, {c: sorted(s) for c, s in by_command.items()})
    assert checked >= 2  # -L and -T at least


# ------------------------------------------------------------------ the README against --help


README = ROOT / "README.md"


def _options_of(command: str) -> set[str]:
    cmd = get_command(app).commands[command]
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}


def _help_text(command: str) -> str:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, command
    return result.output


def _readme_command_lines() -> list[tuple[str, list[str]]]:
    """Every `tflabench CMD ...` the README shows (code blocks and inline code): (CMD, its options)."""
    text = README.read_text(encoding="utf-8")
    snippets = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S):
        snippets += [line.split("#", 1)[0] for line in block.splitlines()]
    snippets += re.findall(r"`(tflabench [^`]*)`", text)
    commands = set(get_command(app).commands)
    found = []
    for snippet in snippets:
        for part in re.split(r"&&|;|\|", snippet):
            words = part.split()
            if len(words) >= 2 and words[0] == "tflabench" and words[1] in commands:
                found.append((words[1], [w for w in words[2:] if re.match(r"^--?[a-zA-Z]", w)]))
    return found


def test_every_option_the_readme_shows_exists_in_that_commands_help():
    lines = _readme_command_lines()
    assert len(lines) >= 20  # the tour, the benchmarks, CI
    helps = {}
    for command, options in lines:
        known = _options_of(command)
        if command not in helps:     # one --help per command (setdefault would run it per line)
            helps[command] = _help_text(command)
        help_text = helps[command]
        for option in options:
            name = option.split("=", 1)[0]
            assert name in known and name in help_text, f"README: tflabench {command} {name}"


def test_the_option_table_of_docs_model_matches_each_analytic_command():
    text = (README.parent / "docs" / "model.md").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| option | meaning |"))
    commands = [c.strip() for c in header.strip("|").split("|")[2:]]
    assert commands == ["flops", "roofline", "intensity", "optimal-chunk"]
    rows = [line for line in text.splitlines() if re.match(r"^\| `-", line)]
    assert len(rows) >= 12
    helps = {command: _help_text(command) for command in commands}   # one --help per command
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        options = re.findall(r"`(-[-a-zA-Z]+)`", cells[0])
        for command, mark in zip(commands, cells[2:]):
            known = _options_of(command)
            for option in options:
                if mark == "✓":
                    assert option in known and option in helps[command], f"{command} lacks {option}"
                else:
                    assert option not in known, f"docs/model.md says {command} has no {option}, but it does"


def test_a_missing_dependency_is_one_line_and_status_2_not_a_bug(monkeypatch, capsys):
    """A dependency of tflabench that this Python lacks (here: typer's app raising the
    ModuleNotFoundError an import of pydantic would) ends in one ``error:`` line naming the
    package and how to install it, exit status 2; a module that is no dependency of ours
    stays an internal error (status 3, with the traceback)."""
    import tflabench.cli as cli

    assert cli.missing_dependency(ModuleNotFoundError("x", name="pydantic")) == "pydantic"
    assert cli.missing_dependency(ModuleNotFoundError("x", name="yaml")) == "pyyaml"
    assert cli.missing_dependency(ModuleNotFoundError("x", name="scipy.stats")) == "scipy"
    assert cli.missing_dependency(ModuleNotFoundError("x", name="fla")) is None
    assert cli.missing_dependency(ValueError("pydantic")) is None
    for name, status in (("pydantic", 2), ("mamba_ssm", cli.EXIT_INTERNAL_ERROR)):
        def app(name=name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        monkeypatch.setattr(cli, "app", app)
        with pytest.raises(SystemExit) as stop:
            cli.main()
        assert stop.value.code == status
        err = capsys.readouterr().err
        if status == 2:
            assert err.count("\n") == 1 and err.startswith("error: tflabench needs the package 'pydantic'")
            assert "Traceback" not in err
        else:
            assert "Traceback" in err and "internal error" in err
