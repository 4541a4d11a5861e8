"""`tokenrouter throughput`: the paper preset, file input, single-B prediction, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tokenrouter.launch.cli import main


def _best(output: str) -> list[str]:
    return re.findall(r"B\* = (\[[\d, ]+\])", output)


def test_paper_preset_reproduces_the_paper(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throughput", "--paper"]) == 0
    out = capsys.readouterr().out
    assert _best(out) == ["[1, 2]", "[1, 2]", "[1, 3]"]
    assert re.search(r"\* \[1, 3\]\s+207\.9\d", out)  # N = 4


def test_file_input_with_flag_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "pair.json"
    spec.write_text(json.dumps({"P": [[1, 0], [1, 0]], "C": [[1, 0], [1, 0]], "L_ms": [5.0, [20.0, 21.0]],
                                "delta_ms": 1.0, "N": 2}))
    assert main(["throughput", "--file", str(spec), "--B", "1", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\* \[1, 1\]\s+400\.00", out)  # no routing: 2 rows per 5 ms step


def test_yaml_file_and_top(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "pair.yaml"
    spec.write_text("P: [[0.65, 0.35], [1, 0]]\nC: [[1, 0], [1, 0]]\nL_ms: [6.0, 27.9]\ndelta_ms: 0.1\nN: [4]\n")
    assert main(["throughput", "--file", str(spec), "--top", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.lstrip("* ").startswith("[")]
    assert rows[0].startswith("* [1, 3]") and len(rows) == 2


@pytest.mark.parametrize("argv, message", [
    (["--P", "0.5,0.4;1,0", "--C", "1,0;1,0", "--L-ms", "6", "28", "--delta-ms", "1", "--N", "2"], "sum to 1"),
    (["--paper", "--L-ms", "6.05", "27.9"], "whole multiple"),
    (["--paper", "--B", "3", "3", "--N", "4"], "deadlock"),
    (["--P", "1,0;1,0"], "missing"),
    (["--paper", "--no-chain"], "--no-chain needs --monte-carlo and --B"),
])
def test_errors_exit_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throughput", *argv]) == 2
    assert message in capsys.readouterr().err


def test_handoff_ms_and_the_simulation_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ping-pong between two servers 2 ms apart: 2 tokens per (4 + 12 + 2 * 2) ms = 100 tokens/s in the
    chain and in the simulation; --no-chain prints the simulation only (the chain's column is nan)."""
    spec = tmp_path / "pair.json"
    spec.write_text(json.dumps({"P": [[0, 1], [1, 0]], "C": [[1, 1], [1, 1]], "L_ms": [4.0, 12.0],
                                "delta_ms": 1.0, "N": 1}))
    argv = ["throughput", "--file", str(spec), "--B", "1", "1", "--handoff-ms", "2", "--monte-carlo", "2000"]
    assert main(argv) == 0
    assert re.search(r"\* \[1, 1\]\s+100\.00\s+100\.0\d", capsys.readouterr().out)
    assert main([*argv, "--no-chain"]) == 0
    assert re.search(r"\* \[1, 1\]\s+nan\s+100\.0\d", capsys.readouterr().out)


def test_prefill_charges_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One model, one request of 8 tokens whose first step prefills 31 prompt tokens: 8 tokens per
    (8 * 4 + 30 * 0.1 + 2) ms = 216.22 tokens/s, in the chain (fine grid) and in the simulation."""
    spec = tmp_path / "pair.yaml"
    spec.write_text("P: [[1]]\nC: [[1]]\nL_ms: [4.0]\ndelta_ms: 0.0001\nN: 1\nB: [1]\n"
                    "per_token_ms: [0.1]\narrival_ms: [2.0]\nprompt_tokens: [31, 31]\noutput_tokens: 8\n")
    assert main(["throughput", "--file", str(spec), "--monte-carlo", "4000"]) == 0
    out = capsys.readouterr().out
    assert "charge per row 0.625 ms" in out
    assert re.search(r"\* \[1\]\s+216\.2\d\s+216\.2\d", out)


def test_prefill_charges_need_every_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["throughput", "--paper", "--per-token-ms", "0.01", "0.05", "--output-tokens", "32"]) == 2
    assert "prefill charges need all of" in capsys.readouterr().err
