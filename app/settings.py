"""Server settings: each one has a default, an environment variable and a flag.

Read once at start-up (`Settings.from_env()`); the command line of
`python -m app` sets the same environment variables before gunicorn starts,
so a gunicorn deployment configured only by environment behaves the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    flag: str
    default: str
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("model", "ETSERVE_MODEL", "--model", "qwen2.5-coder-0.5b",
            "name of a model this project builds (python -m app.models list)"),
    Setting("model_path", "ETSERVE_MODEL_PATH", "--model-path", "",
            "a built model directory, or a .pte file with tokenizer files beside it (overrides --model)"),
    Setting("model_id", "ETSERVE_MODEL_ID", "--model-id", "",
            "the model name clients use (default: the model's name)"),
    Setting("host", "ETSERVE_HOST", "--host", "127.0.0.1", "address to bind"),
    Setting("port", "ETSERVE_PORT", "--port", "8000", "port to bind"),
    Setting("threads", "ETSERVE_THREADS", "--threads", "0", "runtime threads (0: one per core)"),
    Setting("prefill_chunk", "ETSERVE_PREFILL_CHUNK", "--prefill-chunk", "128",
            "prompt tokens per forward call; cancellation is checked between chunks"),
    Setting("max_queue", "ETSERVE_MAX_QUEUE", "--max-queue", "16",
            "requests that may wait while one generates; more get 429"),
    Setting("queue_timeout", "ETSERVE_QUEUE_TIMEOUT", "--queue-timeout", "300",
            "seconds a request may wait for the model before a 503"),
    Setting("api_key", "ETSERVE_API_KEY", "--api-key", "",
            "require this key (Authorization: Bearer or X-Api-Key) on every route but /health"),
    Setting("max_body_bytes", "ETSERVE_MAX_BODY_BYTES", "--max-body-bytes", str(4 * 1024 * 1024),
            "largest request body accepted"),
)


@dataclass(frozen=True)
class Settings:
    model: str
    model_path: str
    model_id: str
    host: str
    port: int
    threads: int
    prefill_chunk: int
    max_queue: int
    queue_timeout: int
    api_key: str
    max_body_bytes: int

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        values = {s.name: env.get(s.env, s.default) for s in SETTINGS}
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for name, value in values.items():
            if types[name] in (int, "int"):
                try:
                    out[name] = int(value)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, got {value!r}") from None
            else:
                out[name] = value
        return cls(**out)
