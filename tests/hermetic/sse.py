"""Reading an SSE body as the tests need it."""

from __future__ import annotations

import json


def events(text: str) -> list[dict]:
    """The JSON events of an SSE body, which must end with `data: [DONE]` (comments skipped)."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert blocks and blocks[-1] == "data: [DONE]", text[-300:]
    out = []
    for block in blocks[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        out.append(json.loads(lines[0][6:]))
    return out


def content(chunks: list[dict], index: int = 0) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"] and c["choices"][0]["index"] == index)


def finish_reasons(chunks: list[dict]) -> dict[int, str]:
    return {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"] is not None}
