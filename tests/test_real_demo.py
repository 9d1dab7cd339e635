"""`npu-manager demo --real`: real models on a real driver, direct and managed."""

from __future__ import annotations

import json

import pytest

from npumanager.cli import main

pytest.importorskip("onnxruntime")


def test_demo_real_prints_the_simulated_demos_keys_for_both_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--real", "--driver", "onnxruntime", "--seconds", "0.3", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert set(runs) == {"direct", "managed"}
    for metrics in runs.values():
        assert set(metrics) == {
            "camera_frames",
            "camera_deadline_misses",
            "camera_p99_ms",
            "background_jobs_done",
            "jobs_done",
        }
        assert metrics["camera_frames"] >= 1
        assert metrics["jobs_done"]["camera"] == metrics["camera_frames"]


def test_demo_real_table_names_the_driver(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--driver", "onnxruntime", "--seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "real models on onnxruntime" in out
    assert "camera deadline misses" in out and "MANAGED" in out


def test_demo_real_with_a_simulated_driver_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--real", "--driver", "reference", "--seconds", "0.1"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
