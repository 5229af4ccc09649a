"""The engine: the ctypes binding to native/, the generation lock, prefix reuse."""

from .cancel import CancelToken
from .engine import (
    ContextLengthError,
    Engine,
    Generation,
    GenerationRequest,
    GenerationStats,
    PromptProgress,
    QueueFullError,
    QueueTimeoutError,
    TokenEvent,
)
from .native import ModelInfo, NativeError, NativeModel, Status, set_num_threads
from .sampling import SamplingParams

__all__ = [
    "CancelToken",
    "ContextLengthError",
    "Engine",
    "Generation",
    "GenerationRequest",
    "GenerationStats",
    "PromptProgress",
    "ModelInfo",
    "NativeError",
    "NativeModel",
    "QueueFullError",
    "QueueTimeoutError",
    "SamplingParams",
    "Status",
    "TokenEvent",
    "set_num_threads",
]
