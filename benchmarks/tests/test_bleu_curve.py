"""benchmarks.bleu_curve: drawing curves, and refusing what is not a run or a curve.
(Scoring a run's checkpoints: tests/test_train.py, on its shared run.)"""

import json

import pytest

from benchmarks import bleu_curve as curve

pytestmark = pytest.mark.once


def write_curve(path, label, points):
    path.write_text(json.dumps({"label": label, "points": points}))
    return path


def test_plot_draws_one_line_per_curve(tmp_path, capsys):
    ours = write_curve(
        tmp_path / "ours.json",
        "ours",
        [{"minutes": 5.0, "bleu": 20.0}, {"minutes": 10.0, "bleu": 30.5}],
    )
    peer = write_curve(tmp_path / "peer.json", "peer", [{"minutes": 7, "bleu": 9}])
    image = tmp_path / "bleu.png"
    drawn = curve.main(["plot", str(ours), str(peer), "--out", str(image)])
    assert drawn == [("ours", [5.0, 10.0], [20.0, 30.5]), ("peer", [7.0], [9.0])]
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(image) in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, why",
    [
        ("{", "not a curve file"),
        ('{"label": "x"}', "not a curve file"),
        ('{"points": []}', "no points"),
        ('{"points": [{"minutes": 1}]}', "not a curve file"),
    ],
)
def test_plot_names_a_bad_curve_file(tmp_path, capsys, content, why):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    image = tmp_path / "bleu.png"
    with pytest.raises(SystemExit) as exit_info:
        curve.main(["plot", str(bad), "--out", str(image)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and why in err
    assert not image.exists()


def test_score_refuses_what_is_not_a_finished_run(tmp_path, capsys):
    source, reference = tmp_path / "s.txt", tmp_path / "r.txt"
    source.write_text("eins\n")
    reference.write_text("one\n")
    files = ["--source", str(source), "--reference", str(reference)]
    run = tmp_path / "run"
    run.mkdir()
    cases = [
        (lambda: None, "not a kt-train run folder"),
        (lambda: (run / "run.json").write_text('{"settings": {}}'), "no checkpoints"),
    ]
    for prepare, why in cases:
        prepare()
        with pytest.raises(SystemExit) as exit_info:
            curve.main(["score", "--run", str(run), *files])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert str(run) in err and why in err
    # A bad corpus is named before the run is looked at.
    reference.write_text("one\ntwo\n")
    with pytest.raises(SystemExit):
        curve.main(["score", "--run", str(run), *files])
    assert str(reference) in capsys.readouterr().err


def test_spaced_keeps_the_first_the_last_and_points_far_enough_apart():
    minutes = [0.5, 1.0, 2.0, 2.4, 3.1, 3.2, 5.0, 5.1]
    assert curve.spaced(minutes, 0.0) == list(range(8))
    assert curve.spaced(minutes, 1.0) == [0, 2, 4, 6, 7]
    assert curve.spaced(minutes, 100.0) == [0, 7]
    assert curve.spaced([4.0], 1.0) == [0]
