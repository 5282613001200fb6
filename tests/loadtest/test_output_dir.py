"""Where ``loadtest.paper.run`` writes: scratch by default, the committed results only when asked.

``make loadtest`` (the quick profile) used to overwrite loadtest/results/quick.
These tests check the runner's path logic and ``main`` itself with the load
(``run_point``) replaced by a stub, so no server or Locust is started.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loadtest.paper import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("profile", sorted(run.PROFILES))
def test_default_output_is_the_scratch_folder(profile: str) -> None:
    out = run.output_dir(run.parse_args(["--profile", profile]))
    assert out == ROOT / "loadtest" / "out" / profile
    assert not out.is_relative_to(ROOT / "loadtest" / "results")


def test_quick_is_the_default_profile_and_writes_to_scratch() -> None:
    assert run.output_dir(run.parse_args([])) == ROOT / "loadtest" / "out" / "quick"


@pytest.mark.parametrize("profile", sorted(run.PROFILES))
def test_results_flag_writes_the_committed_results(profile: str) -> None:
    out = run.output_dir(run.parse_args(["--profile", profile, "--results"]))
    assert out == ROOT / "loadtest" / "results" / profile


def test_out_wins_and_excludes_results(tmp_path: Path) -> None:
    assert run.output_dir(run.parse_args(["--out", str(tmp_path)])) == tmp_path
    with pytest.raises(SystemExit):
        run.parse_args(["--out", str(tmp_path), "--results"])


def _fake_row(p: Any) -> dict[str, Any]:
    return {"experiment": p.experiment, "mode": p.mode, "users": p.users, "tag": "x",
            "published": 1, "scheduled": 1, "received": p.users, "expected": p.users,
            "rmp_pct": 100.0, "duplicates": 0, "mpt_mean_s": 0.0, "mpt_p99_s": 0.0,
            "nt": None, "smu_peak_mb": 1.0, "server_cpu_pct": 0.0, "gen_cpu_pct": 0.0,
            "gen_cpu_peak_pct": 0.0}


@pytest.mark.parametrize("flags,where", [([], "out"), (["--results"], "results")])
def test_main_writes_where_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str], flags: list[str],
                                 where: str) -> None:
    """`main` for the quick profile, in a copy of the tree's layout under tmp_path."""
    ran: list[Any] = []

    def fake_point(p: Any, out: Path, progress: Any, run_id: str) -> list[dict[str, Any]]:
        ran.append(p)
        return [_fake_row(p)]

    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(run, "run_point", fake_point)
    monkeypatch.setattr(run, "raise_nofile", lambda: None)
    sigterm = signal.getsignal(signal.SIGTERM)  # main installs its own handler
    try:
        assert run.main(["--profile", "quick", "--no-report", *flags]) == 0
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    other = {"out": "results", "results": "out"}[where]
    written = tmp_path / "loadtest" / where / "quick" / "results.jsonl"
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert ran and len(rows) == len(ran)
    assert not (tmp_path / "loadtest" / other).exists()
    assert f"results in {written.parent}" in capsys.readouterr().out


def _make_loadtest_command(*assignments: str) -> list[str]:
    """The command `make loadtest` would run (make -n prints it, runs nothing)."""
    r = subprocess.run(["make", "-n", "loadtest", *assignments], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if "loadtest.paper.run" in line]
    assert len(lines) == 1, r.stdout
    return shlex.split(lines[0])


def test_make_loadtest_writes_scratch_unless_results_is_set() -> None:
    assert "--results" not in _make_loadtest_command()
    assert "--results" not in _make_loadtest_command("RESULTS=0")
    args = _make_loadtest_command("RESULTS=1")
    assert args[-1] == "--results" and "--profile" in args
    # and what the runner makes of the default command line: the scratch folder
    default = _make_loadtest_command()
    argv = default[default.index("loadtest.paper.run") + 1:]
    assert run.output_dir(run.parse_args(argv)) == ROOT / "loadtest" / "out" / "quick"
