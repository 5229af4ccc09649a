"""Tokenizing, detokenizing and rendering the chat template, with the model the server serves."""

from __future__ import annotations

from typing import Any

from app.http.chat import ChatRequest, ChatService
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
        add_bos = None if request.add_special else False
        tokens = self.model.tokenizer.encode(request.text, add_bos=add_bos)
        if request.vllm:
            return {"tokens": tokens, "count": len(tokens), "max_model_len": self.model.context_length}
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
