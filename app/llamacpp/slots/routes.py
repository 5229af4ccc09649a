"""GET /slots: llama.cpp's monitor of sequence slots.

One entry per slot: its id, whether a request uses it (`state`, `task`: prefill or decode, the
request's sequence number; llama.cpp's `is_processing` and `id_task`, -1 when idle), the
session whose conversation it holds, how many positions of its context are filled
(`n_ctx_used` of `n_ctx`), the running request's prompt and
generated token counts, and its memory (`reserved_bytes` mapped for it, `resident_bytes` of
those in memory; slot 0's caches are part of the program's planned memory). No prompt text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import falcon

if TYPE_CHECKING:
    from app.model_host import ServedModel


class SlotsResource:
    def __init__(self, model: "ServedModel"):
        self.model = model

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.model.engine.slots_report()
