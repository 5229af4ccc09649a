"""/completion: each prompt tokenized (llama.cpp's way: BOS as the model's config says, special
tokens written in the text read as such), its choices run by app.llamacpp.run."""

from __future__ import annotations

from typing import Any, Iterator

from app.engine import CancelToken
from app.http.errors import invalid_value
from app.http.generation_params import check_token_ids
from app.http.planning import check_model, check_token_list, vocab_limit
from app.model_host import ServedModel
from app.output import OutputOptions

from ..run import LlamaRun, Task, plan
from .protocol import CompletionRequest, Piece


class Completion:
    def __init__(self, model: ServedModel):
        self.model = model

    def _tokens(self, pieces: tuple[Piece, ...], param: str) -> list[int]:
        tokenizer = self.model.tokenizer
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, str):
                ids += tokenizer.encode(piece, add_bos=None if i == 0 else False)
            else:
                ids.append(piece)
        check_token_list([p for p in pieces if not isinstance(p, str)], vocab_limit(self.model), param)
        if not ids:
            raise invalid_value(param, f"'{param}' has no tokens")
        return ids

    def prepare(self, request: CompletionRequest) -> LlamaRun:
        """Everything that can fail because of the request fails here, before any output."""
        llama = request.llama
        check_model(self.model, llama.model)
        self.model.engine.check_admission()
        check_token_ids(llama.params, self.model.tokenizer.vocab_size)
        tasks = []
        for i, pieces in enumerate(request.prompts):
            param = "prompt" if len(request.prompts) == 1 else f"prompt[{i}]"
            tokens = self._tokens(pieces, param)
            generation = plan(self.model, tokens, llama, param=param, session_id=request.session_id)
            text = "".join(p for p in pieces if isinstance(p, str)) if all(isinstance(p, str) for p in pieces) \
                else self.model.tokenizer.decode(tokens)
            tasks.append(Task(generation, prompt=text))
        return LlamaRun(self.model, llama, tasks, OutputOptions(stops=llama.params.stop, n_indent=llama.n_indent))

    def complete(self, run: LlamaRun, cancel: CancelToken) -> dict[str, Any] | list[dict[str, Any]]:
        return run.complete(cancel)

    def stream(self, run: LlamaRun, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        return run.stream(cancel)
