"""Progress bars: drawn on a terminal (or when forced), silent in logs."""

from __future__ import annotations

import io

from dynamiq.bench.progress import progress_bar, quiet


def test_forced_bar_draws_count_and_notes():
    s = io.StringIO()
    bar = progress_bar(10, "dynamiq", initial=2, enabled=True, file=s)
    assert not quiet(bar)
    for _ in range(8):
        bar.update()
    bar.set_postfix_str("val 3.25")
    bar.close()
    text = s.getvalue()
    assert "dynamiq" in text and "10/10" in text and "val 3.25" in text
    assert "2/10" in text  # a resumed run starts where it stopped


def test_bar_is_silent_off_a_terminal():
    s = io.StringIO()  # not a TTY, like a log file or a test's captured stream
    bar = progress_bar(5, "quiet", file=s)
    assert quiet(bar)
    bar.update(5)
    bar.close()
    assert s.getvalue() == ""


def test_disabled_bar_and_zero_total():
    s = io.StringIO()
    bar = progress_bar(0, "empty", enabled=False, file=s)
    assert quiet(bar) and bar.total == 1
    bar.close()
    assert s.getvalue() == ""
