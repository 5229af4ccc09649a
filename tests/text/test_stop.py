"""StopMatcher: streamed output equals the text cut at the earliest stop."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from app.text.stop import IndentStop, StopMatcher


def expected(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [i for s in stops if s and (i := text.find(s)) >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def run(chunks: list[str], stops: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out, stopped = "", False
    for chunk in chunks:
        delta, stopped = m.push(chunk)
        out += delta
        if stopped:
            assert m.push("more") == ("", True)
            return out, True
    out += m.flush()
    return out, m.stopped


@st.composite
def split_text(draw, alphabet="abc"):
    text = draw(st.text(alphabet, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=300, deadline=None)
@given(split_text(), st.lists(st.text("abc", max_size=4), max_size=4))
def test_matches_reference(split, stops):
    text, chunks = split
    assert run(chunks, stops) == expected(text, stops)


@settings(max_examples=300, deadline=None)
@given(split_text(), st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=3))
def test_never_emits_then_retracts(split, stops):
    text, chunks = split
    final, _ = expected(text, stops)
    m, out = StopMatcher(stops), ""
    for chunk in chunks:
        delta, stopped = m.push(chunk)
        out += delta
        assert final.startswith(out)
        assert not any(s in out for s in stops)
        if stopped:
            break


def test_split_across_many_pushes():
    m = StopMatcher(["</answer>"])
    assert m.push("The result <") == ("The result ", False)
    assert m.push("/ans") == ("", False)
    assert m.push("wer> tail") == ("", True)
    assert m.push("x") == ("", True)
    assert m.flush() == ""


def test_false_alarm_released():
    m = StopMatcher(["\n\nUser:"])
    assert m.push("a\n\nUs") == ("a", False)
    assert m.push("ual") == ("\n\nUsual", False)
    assert m.push("\n") == ("", False)
    assert m.flush() == "\n" and not m.stopped


def test_earliest_position_wins():
    assert run(["xx STOP2 yy STOP1"], ["STOP1", "STOP2"]) == ("xx ", True)
    # A longer stop starting earlier beats a shorter one completed first.
    assert run(["ab", "c", "d"], ["c", "abcd"]) == ("", True)
    assert run(["ab", "c", "x"], ["c", "abcd"]) == ("ab", True)
    assert run(["ab", "c"], ["c", "abcd"]) == ("ab", True)  # resolved at flush


def test_no_or_empty_stops_pass_through():
    for stops in ([], [""]):
        m = StopMatcher(stops)
        assert m.push("hello") == ("hello", False)
        assert m.flush() == ""


def test_unicode():
    assert run(["你好", "世", "界"], ["世界"]) == ("你好", True)


# --------------------------------------------------------------------- n_indent (fill in the middle)



def run_indent(n: int, pieces: list[str]) -> tuple[str, bool]:
    stop, out = IndentStop(n), []
    for piece in pieces:
        text, stopped = stop.push(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + stop.flush(), False


@pytest.mark.parametrize("text, n, expected, stopped", [
    ("return a + b\n\nprint(add(3, 4))", 4, "return a + b\n", True),  # an empty line leaves the block
    ("s += x\n    return s\n\ndef mean(xs):", 4, "s += x\n    return s\n", True),
    ("s += x\n        t += 1\n    return s", 8, "s += x\n        t += 1\n", True),
    ("x = 1\n\ty = 2\nz", 1, "x = 1\n\ty = 2\n", True),  # a tab counts one column, as in llama.cpp
    ("first line is never checked\n    and so on   ", 4, "first line is never checked\n    and so on   ", False),
    ("anything\nat all", 0, "anything\nat all", False),  # 0: no such end
    ("ends in indentation\n  ", 4, "ends in indentation\n  ", False),  # undecided at the end: kept
])
def test_indent_stop_whatever_the_cuts(text, n, expected, stopped):
    for size in (1, 2, 3, 5, len(text)):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        assert run_indent(n, pieces) == (expected, stopped), size
