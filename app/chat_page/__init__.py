"""GET /: a small chat page over /v1/chat/completions (one template, inline CSS and JS, no build step)."""

from .resource import ChatPageResource

__all__ = ["ChatPageResource"]
