"""Tool-call formats, one module each, registered here.

Each format module exposes READERS: the markers that open its constructs in model output,
each with the reader that decides what the construct is (see calls.BlockReader). The scanner
looks for every registered marker. JSON that is the whole output is read by json_call's
`read_bare` (it has no marker). The format we ask models for (prompt, history text, grammar)
is Hermes.
"""

from __future__ import annotations

from ..calls import BlockReader
from . import hermes, json_call, qwen_xml

FORMATS = (hermes, qwen_xml, json_call)

READERS: dict[str, BlockReader] = {}
for _format in FORMATS:
    READERS.update(_format.READERS)

__all__ = ["FORMATS", "READERS", "hermes", "json_call", "qwen_xml"]
