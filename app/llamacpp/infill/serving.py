"""/infill: a FIM prompt in the model's own tokens, one choice through the shared output pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from app.engine import CancelToken, GenerationRequest
from app.model_host import ServedModel
from app.openai.common import check_model, fim_generation, fim_prompt, plan_generation, timings
from app.openai.generation_params import check_token_ids
from app.output import ChoicePipeline, OutputOptions

from . import shapes
from .protocol import InfillRequest


@dataclass(frozen=True)
class PreparedInfill:
    request: InfillRequest
    generation: GenerationRequest


class Infill:
    def __init__(self, model: ServedModel):
        self.model = model

    def prepare(self, request: InfillRequest) -> PreparedInfill:
        """Everything that can fail because of the request fails here, before any output."""
        check_model(self.model, request.model)
        self.model.engine.check_admission()
        check_token_ids(request.params, self.model.tokenizer.vocab_size)
        tokens = fim_prompt(self.model, request.prefix, request.suffix, extra=request.extra, typed=request.typed,
                            param="input_prefix")
        generation = plan_generation(self.model, tokens, request.params, param="input_prefix",
                                     session_id=request.session_id)
        return PreparedInfill(request, fim_generation(self.model, generation))

    def _pipeline(self, prepared: PreparedInfill, cancel: CancelToken) -> ChoicePipeline:
        return ChoicePipeline(self.model.engine.generate(prepared.generation, cancel), self.model.tokenizer,
                              OutputOptions(stops=prepared.request.params.stop, n_indent=prepared.request.n_indent))

    def complete(self, prepared: PreparedInfill, cancel: CancelToken) -> dict[str, Any]:
        pipeline = self._pipeline(prepared, cancel)
        out = pipeline.run()
        return shapes.final(self.model.id, out.content, out.stats, _stop_type(pipeline), out.stop_sequence,
                            timings(out.stats))

    def stream(self, prepared: PreparedInfill, cancel: CancelToken) -> Iterator[dict[str, Any]]:
        pipeline = self._pipeline(prepared, cancel)
        for delta in pipeline:  # no reasoning or tools here: every delta is text
            yield shapes.chunk(delta.text)
        if not pipeline.cancelled:
            yield shapes.final(self.model.id, "", pipeline.stats, _stop_type(pipeline), pipeline.stop_sequence,
                               timings(pipeline.stats))


def _stop_type(pipeline: ChoicePipeline) -> str:
    return shapes.stop_type(pipeline.finish_reason, pipeline.stop_sequence, pipeline.indent_stopped)
