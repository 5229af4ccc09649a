"""Model catalogue and build tooling: ``python -m app.models build|path|list|verify``.

Importing this package is cheap; build-time dependencies (torch, executorch, gguf, transformers)
are imported lazily inside the functions that need them.
"""

from .registry import MODELS, BuildOptions, default_model_dir, model_dir, resolve_options

__all__ = ["MODELS", "BuildOptions", "default_model_dir", "model_dir", "resolve_options"]
