"""Text pipeline between HTTP and the engine: tokenize, template, detokenize, stop."""

from app.text.chat_template import ChatTemplate, TemplateError
from app.text.detokenizer import IncrementalDetokenizer
from app.text.stop import StopMatcher
from app.text.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "IncrementalDetokenizer", "StopMatcher", "TemplateError", "Tokenizer"]
