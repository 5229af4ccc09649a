"""A plain ChatML chat template, for tokenizers that ship none (--allow-chatml-fallback).

Each message becomes ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``; the generation
prompt opens an assistant turn. It does not describe tools: like any template
that ignores ``tools``, the chat route puts them in the system message, and an
assistant turn's calls arrive already written into its content.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
