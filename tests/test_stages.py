"""The one stage runner: a stage's done.json, skipping a finished stage, the old markers, copies, stops, Ctrl-C."""

from __future__ import annotations

import json

import pytest

from lmlm.stages import MARKER, Stopped, copy_stage, finish_stage, resumable, run_stage, stage_done, stop_after


def test_a_stage_runs_once_and_its_summary_is_read_after(tmp_path):
    calls = []

    def stage():
        calls.append(1)
        (tmp_path / "kb" / "out.txt").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "kb" / "out.txt").write_text("x")
        return {"triples": 3}

    first = run_stage(tmp_path / "kb", stage, "kb")
    assert first["triples"] == 3 and first["seconds"] >= 0
    assert json.loads((tmp_path / "kb" / MARKER).read_text()) == first
    again = run_stage(tmp_path / "kb", stage, "kb")
    assert again == first and calls == [1]


def test_a_stage_that_fails_leaves_no_marker_and_runs_again(tmp_path):
    def broken():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_stage(tmp_path / "s", broken, "s")
    assert stage_done(tmp_path / "s") is None
    assert run_stage(tmp_path / "s", lambda: {"ok": True}, "s")["ok"] is True


def test_an_older_folders_marker_reads_as_done(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "data.json").write_text('{"counts": 4}\n')
    got = run_stage(tmp_path / "data", lambda: pytest.fail("a stage done before ran again"), "data",
                    legacy=tmp_path / "results" / "data.json")
    assert got == {"counts": 4} and not (tmp_path / "data" / MARKER).exists()
    assert stage_done(tmp_path / "data") is None  # without the old name it is not done


def test_a_copied_stage_is_not_done_until_its_own_stage_finishes(tmp_path):
    src, dst = tmp_path / "kb", tmp_path / "kb-copy"
    src.mkdir()
    (src / "kb.sqlite").write_text("facts")
    (src / "built.json").write_text("{}")
    finish_stage(src, {"triples": 2})
    dst.mkdir()
    (dst / "stale").write_text("old")
    copy_stage(src, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["kb.sqlite"] and stage_done(dst) is None


def test_stop_after_raises_only_at_its_stage():
    stop_after("corpus", None)
    stop_after("corpus", "kb")
    with pytest.raises(Stopped) as e:
        stop_after("kb", "kb")
    assert e.value.stage == "kb"


def test_ctrl_c_says_the_same_command_goes_on(tmp_path, capsys):
    with pytest.raises(SystemExit) as e, resumable(tmp_path):
        raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert e.value.code == 130 and str(tmp_path) in err and "the same command goes on from there" in err
