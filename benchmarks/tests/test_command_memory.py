"""benchmarks/command_memory.py without a model: the peak memory it reads
for one process, its turns and checks with stand-in commands, and its
arithmetic against values worked out by hand here. (The real comparison, on
the number task's export, is in tests/test_export_commands.py.)"""

import sys

import pytest

from benchmarks import command_memory

pytestmark = pytest.mark.once
MIB = 1 << 20


def python(code):
    return [sys.executable, "-c", code]


def test_run_measured_reads_the_peak_of_that_process_alone():
    big = "b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); print('big')"
    status, peak, out, err = command_memory.run_measured(python(big))
    assert (status, out, err) == (0, "big\n", "")
    assert peak >= 96 * MIB
    # Neither the earlier, larger process's peak nor this test process's
    # size (its children start with it) is counted.
    echo = "import sys; sys.stdout.write(sys.stdin.read().upper())"
    status, small, out, _ = command_memory.run_measured(python(echo), "ab\ncd\n")
    assert (status, out) == (0, "AB\nCD\n")
    assert 0 < small < 64 * MIB
    status, _, _, err = command_memory.run_measured(python("raise SystemExit(3)"))
    assert status == 3


def test_measure_takes_turns_and_checks_each_run(monkeypatch, tmp_path):
    # Stand-ins: one line per sentence, "CTranslate2" holding 40 MiB more.
    lines = "import sys; sys.stdout.write(sys.stdin.read())"
    hold = f"b = bytearray(40 << 20); b[::4096] = b'x' * len(b[::4096]); {lines}"
    monkeypatch.setattr(command_memory, "alone_command", lambda e, b: python(hold))
    monkeypatch.setattr(command_memory, "command_line", lambda e, b: python(lines))
    result = command_memory.measure(tmp_path, ["a", "b", "c"], beam_size=2, repeats=2)
    peaks = result["peak_rss_bytes"]
    assert [len(v) for v in peaks.values()] == [2, 2]
    assert result["ratio"] < 1 and result["within_limit"]
    assert result["same_translations"] and result["sentences"] == 3
    assert "kt-translate / CTranslate2 alone" in command_memory.report(result)
    # A run that prints a line too few, or fails, stops the measurement.
    monkeypatch.setattr(
        command_memory, "command_line", lambda e, b: python("print('one')")
    )
    with pytest.raises(RuntimeError, match="1 lines for 3 sentences"):
        command_memory.measure(tmp_path, ["a", "b", "c"], repeats=1)


def test_summarize_takes_the_medians_and_their_ratio():
    peaks = {
        "ctranslate2": [100 * MIB, 104 * MIB, 98 * MIB],
        "kt-translate": [110 * MIB, 109 * MIB, 200 * MIB],
    }
    outputs = {"ctranslate2": ["x"], "kt-translate": ["y"]}
    result = command_memory.summarize(peaks, outputs, "ct2", 4, 1)
    assert result["median_peak_rss_bytes"] == {
        "ctranslate2": 100 * MIB,
        "kt-translate": 110 * MIB,
    }
    assert result["ratio"] == pytest.approx(1.10)
    assert result["within_limit"] and not result["same_translations"]
    text = command_memory.report(result)
    assert "100.0 MiB" in text and "110.0 MiB" in text and "1.100 (within" in text


def test_the_baseline_uses_the_engines_threads():
    from keras_transformer.translate import ctranslate2_translator as engine

    assert command_memory.INTER_THREADS == engine.DEFAULT_INTER_THREADS
    assert command_memory.INTRA_THREADS == engine.DEFAULT_INTRA_THREADS
    command = command_memory.alone_command("ct2", 4)
    assert command[3:] == ["ct2", "4", "2", "1"]
    with pytest.raises(FileNotFoundError, match="kt-no-such-command"):
        command_memory.script("kt-no-such-command")
