"""What the model reads in place of content it cannot read (it reads text only): a short
placeholder naming what was there, and a warning in the log the first time each API meets each
kind. Refusing such content would end a conversation for good, since clients send their whole
history again each turn (a pasted image, an image a tool returned). Chat's `image_url`,
`input_audio` and `file` parts, the Responses API's `input_image`, `input_file` and
`input_audio`, the Messages API's `image` and `document` blocks all come here."""

from __future__ import annotations

import logging

log = logging.getLogger("etserve")

_warned: set[tuple[str, str]] = set()


def placeholder(api: str, kind: str, what: str, name: str | None = None) -> str:
    """`what`: image, audio, file or document; `name`: a file name or title to show, if any."""
    if (api, kind) not in _warned and len(_warned) < 32:
        _warned.add((api, kind))
        log.warning("%s: %s content is not shown to the model (it reads text only); a placeholder stands in "
                    "its place", api, kind)
    shown = f" {name[:200]}" if name else ""
    verb = "heard" if what == "audio" else "shown"
    return f"[{what}{shown}: not {verb}, this model reads text only]"
