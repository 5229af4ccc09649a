"""/infill: a FIM prompt in the model's own tokens (trimmed to fit, nearest the cursor kept),
its choices run by app.llamacpp.run."""

from __future__ import annotations

from typing import Any, Iterator

from app.engine import CancelToken
from app.http.generation_params import check_token_ids
from app.http.planning import check_model, fim_generation, fim_reserve, fit_fim_prompt
from app.model_host import ServedModel
from app.output import OutputOptions

from ..run import LlamaRun, Task, plan
from .protocol import InfillRequest


class Infill:
    def __init__(self, model: ServedModel):
        self.model = model

    def prepare(self, request: InfillRequest) -> LlamaRun:
        """Everything that can fail because of the request fails here, before any output."""
        llama = request.llama
        check_model(self.model, llama.model)
        self.model.engine.check_admission()
        check_token_ids(llama.params, self.model.tokenizer.vocab_size)
        reserve = fim_reserve(self.model, llama.params.max_tokens if llama.n_predict != 0 else 1)
        tokens, truncated = fit_fim_prompt(self.model, request.prefix, request.suffix, extra=request.extra,
                                           typed=request.typed, param="input_prefix", reserve=reserve)
        generation = plan(self.model, tokens, llama, param="input_prefix", session_id=request.session_id)
        task = Task(fim_generation(self.model, generation), truncated=truncated)
        return LlamaRun(self.model, llama, [task], OutputOptions(stops=llama.params.stop, n_indent=llama.n_indent))

    def complete(self, run: LlamaRun, cancel: CancelToken) -> dict[str, Any] | list[dict[str, Any]]:
        return run.complete(cancel)

    def stream(self, run: LlamaRun, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        return run.stream(cancel)
