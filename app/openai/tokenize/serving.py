"""Tokenizing, detokenizing and rendering the chat template, with the model the server serves."""

from __future__ import annotations

from typing import Any

from app.engine.offload import run_blocking
from app.http.chat import LONG_PROMPT_CHARS, ChatRequest, ChatService
from app.http.planning import check_model, check_token_list
from app.model_host import ServedModel

from .protocol import DetokenizeRequest, TokenizeRequest


class Tokenization:
    def __init__(self, model: ServedModel, chat: ChatService):
        self.model = model
        self.chat = chat

    def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        check_model(self.model, request.model)
        # With special tokens: exactly what a text prompt to /v1/completions runs on.
        tokenizer = self.model.tokenizer
        add_bos = None if request.add_special else False
        if request.parse_special:
            encode = lambda: tokenizer.encode(request.text, add_bos=add_bos)  # noqa: E731
        else:  # `<|im_end|>` in the text is those characters' tokens
            bos = tokenizer.bos_token_id
            add = tokenizer.add_bos_token if add_bos is None else add_bos
            head = [bos] if add and bos is not None else []
            encode = lambda: head + tokenizer.encode_text(request.text)  # noqa: E731
        # megabytes take seconds: off the event loop, which serves everyone's tokens meanwhile
        tokens = run_blocking(encode) if len(request.text) > LONG_PROMPT_CHARS else encode()
        if request.vllm:
            return {"tokens": tokens, "count": len(tokens), "max_model_len": self.model.context_length}
        if request.with_pieces:  # llama.cpp's: the piece as text, or its bytes where they are no UTF-8
            return {"tokens": [{"id": t, "piece": _piece(tokenizer.token_bytes(t))} for t in tokens]}
        return {"tokens": tokens}

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        check_model(self.model, request.model)
        check_token_list(request.tokens, self.model.tokenizer.vocab_size, "tokens")
        text = self.model.tokenizer.decode(request.tokens)
        return {"content": text, "prompt": text}  # llama.cpp's name, vLLM's name

    def apply_template(self, request: ChatRequest) -> dict[str, Any]:
        """The prompt a chat completion with these messages, tools and template kwargs would run on."""
        check_model(self.model, request.model)
        return {"prompt": self.chat.render_prompt(request)}


def _piece(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)
