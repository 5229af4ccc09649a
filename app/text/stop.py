"""Stop-string detection over streamed text."""

from __future__ import annotations


class StopMatcher:
    """Cuts a text stream at the earliest occurrence of any stop string.

    Text that might still turn out to be the start of a stop string is held back.
    The result over a whole stream equals the full text cut at the earliest stop
    occurrence, however the text is split into pushes.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops: tuple[str, ...] = tuple(sorted({s for s in stops if s}, key=len))
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once stopped

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, stopped?)."""
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buf = self._held + text
        match = self._earliest_match(buf)
        pending = self._earliest_partial(buf, len(buf) if match is None else match)
        if match is not None and pending is None:
            self.stopped, self._held = True, ""
            self.matched = self._stop_at(buf, match)
            return buf[:match], True
        cut = len(buf) if pending is None else pending
        self._held = buf[cut:]
        return buf[:cut], False

    def flush(self) -> str:
        """End of generation: release held text (up to a stop, if one had matched)."""
        if self.stopped:
            return ""
        buf, self._held = self._held, ""
        match = self._earliest_match(buf)
        if match is not None:
            self.stopped = True
            self.matched = self._stop_at(buf, match)
            return buf[:match]
        return buf

    def _stop_at(self, buf: str, pos: int) -> str:
        """The stop string found at `pos` (the shortest, when several start there)."""
        return next(s for s in self._stops if buf.startswith(s, pos))

    def _earliest_match(self, buf: str) -> int | None:
        found = [i for s in self._stops if (i := buf.find(s)) >= 0]
        return min(found) if found else None

    def _earliest_partial(self, buf: str, limit: int) -> int | None:
        """First position before ``limit`` where ``buf``'s tail is a proper prefix of a stop."""
        start = max(0, len(buf) - len(self._stops[-1]) + 1)
        for pos in range(start, limit):
            tail = buf[pos:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self._stops):
                return pos
        return None


class IndentStop:
    """llama.cpp's `n_indent` for fill in the middle: the middle ends before the first line that is
    indented less than `n_indent` columns (a tab counts one, as there), i.e. where the model leaves
    the block the cursor is in. The first line (the rest of the cursor's) is never checked; a line's
    indentation is held back until its first other character decides it.
    """

    def __init__(self, n_indent: int) -> None:
        self._n = n_indent
        self._held = ""  # a newline and the indentation after it, undecided
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, stopped?)."""
        if self.stopped or self._n <= 0:
            return ("", True) if self.stopped else (text, False)
        out = []
        for ch in text:
            if self._held:
                if ch in " \t":
                    self._held += ch
                    continue
                if len(self._held) - 1 < self._n:  # a line (or an empty one) left of the block
                    self.stopped = True
                    out.append("\n")  # the middle keeps its last newline
                    self._held = ""
                    return "".join(out), True
                out.append(self._held)
                self._held = ""
            if ch == "\n":
                self._held = "\n"
            else:
                out.append(ch)
        return "".join(out), False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held
