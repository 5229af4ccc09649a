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
    switch: bool = False  # a flag without a value (sets the env var to 1); env: 1/true/yes/on or 0/false/no/off


SETTINGS: tuple[Setting, ...] = (
    Setting("model", "ETSERVE_MODEL", "--model", "qwen2.5-coder-0.5b",
            "name of a model this project builds (python -m app.models list), or a .gguf file "
            "(etserve builds it once, cached by its checksum, then serves it)"),
    Setting("model_path", "ETSERVE_MODEL_PATH", "--model-path", "",
            "a built model directory, or a .pte file with tokenizer files beside it (overrides --model)"),
    Setting("quantize", "ETSERVE_QUANTIZE", "--quantize", "",
            "the build of --model to serve: 8da4w (4-bit linears), 8da8w (8-bit linears: closer to a "
            "Q5-Q8 GGUF, twice the bytes) or none (fp32); default the model's own (a .gguf: none up to "
            "1B parameters, else 8da4w). A .gguf is built with it; a named model's build must exist "
            "(python -m app.models build NAME --quantize Q)"),
    Setting("model_id", "ETSERVE_MODEL_ID", "--model-id", "",
            "the model name clients use (default: the model's name)"),
    Setting("models_dir", "ETSERVE_MODELS_DIR", "--models-dir", "",
            "several models on one server (llama.cpp's router mode): each directory in it holding a "
            "model.pte is a model named by its directory, chosen by a request's `model` field (or "
            "`?model=`), loaded on its first request and unloaded least recently used first "
            "(docs/models.md); overrides --model and --model-path"),
    Setting("models_max", "ETSERVE_MODELS_MAX", "--models-max", "2",
            "with --models-dir: models loaded at once"),
    Setting("models_mib", "ETSERVE_MODELS_MIB", "--models-mib", "0",
            "with --models-dir: the loaded models' .pte files may add up to this many MiB (0: no cap)"),
    Setting("host", "ETSERVE_HOST", "--host", "127.0.0.1", "address to bind"),
    Setting("port", "ETSERVE_PORT", "--port", "8000", "port to bind"),
    Setting("threads", "ETSERVE_THREADS", "--threads", "0", "runtime threads (0: one per core)"),
    Setting("prefill_chunk", "ETSERVE_PREFILL_CHUNK", "--prefill-chunk", "128",
            "prompt tokens per forward call; cancellation is checked between chunks"),
    Setting("parallel", "ETSERVE_PARALLEL", "--parallel", "4",
            "sequence slots: requests generating at once, each with a KV state of its own (like "
            "llama.cpp's --parallel); they take turns a forward step at a time (docs/scheduling.md)"),
    Setting("prefill_step_ms", "ETSERVE_PREFILL_STEP_MS", "--prefill-step-ms", "500",
            "longest a prefill step should take: where --prefill-chunk tokens take longer (a long "
            "context on a slow CPU), a step reads fewer, so a request arriving meanwhile soon gets "
            "its turn; 0: always --prefill-chunk"),
    Setting("sched_max_wait", "ETSERVE_SCHED_MAX_WAIT", "--sched-max-wait", "3",
            "seconds a request in flight may wait for its next step while shorter ones go first; "
            "then it goes next (no request starves)"),
    Setting("draft_max", "ETSERVE_DRAFT_MAX", "--draft-max", "32",
            "speculative decoding without a draft model: at most this many tokens guessed from the "
            "prompt and recent outputs are checked in each decode step, and at most what one forward "
            "call of the build holds (31 in the default builds); fewer, or none, as the guesses' "
            "success and the measured cost of wider steps make it pay. The output is the same as "
            "without it. 0: off (docs/scheduling.md)"),
    Setting("kv_cache_mib", "ETSERVE_KV_CACHE_MIB", "--kv-cache-mib", "-1",
            "memory (MiB) the sequence slots' KV caches keep in all once their requests end: past it the "
            "idle slots' cached prompts are cut from their ends, least recently used first (a request in "
            "flight always keeps its whole context); -1: one context's worth, as llama.cpp's shared "
            "cache holds"),
    Setting("max_queue", "ETSERVE_MAX_QUEUE", "--max-queue", "16",
            "requests that may wait for a slot while all are busy; more get 429"),
    Setting("queue_timeout", "ETSERVE_QUEUE_TIMEOUT", "--queue-timeout", "300",
            "seconds a request may wait for a slot before a 503"),
    Setting("api_key", "ETSERVE_API_KEY", "--api-key", "",
            "require this key (Authorization: Bearer or X-Api-Key) on every route but /health and the chat "
            "page; several keys: comma-separated"),
    Setting("metrics_auth", "ETSERVE_METRICS_AUTH", "--metrics-auth", "open",
            "with an API key set, /metrics is 'open' (like /health) or needs the 'key'"),
    Setting("cors_origins", "ETSERVE_CORS_ORIGINS", "--cors-origins", "",
            "web pages (origins, comma-separated; '*' in one matches anything, '*' alone any origin) that may "
            "call the server from a browser, besides its own chat page and pages served from this machine; "
            "with an API key set, any page may (the key is the gate); requests from other pages get 403"),
    Setting("max_body_bytes", "ETSERVE_MAX_BODY_BYTES", "--max-body-bytes", str(4 * 1024 * 1024),
            "largest request body accepted"),
    Setting("session_cache_mib", "ETSERVE_SESSION_CACHE_MIB", "--session-cache-mib", "512",
            "memory (MiB) for the saved KV states of recent sessions (session_id); 0: no sessions"),
    Setting("session_dir", "ETSERVE_SESSION_DIR", "--session-dir", "",
            "a directory where KV states are kept on disk (the live one after each generation, and those "
            "evicted from memory), found again after a restart; a request restores the saved state "
            "sharing the longest prefix with its prompt; empty: memory only"),
    Setting("session_dir_mib", "ETSERVE_SESSION_DIR_MIB", "--session-dir-mib", "4096",
            "most disk (MiB) the --session-dir states may take; the least recently used go first"),
    Setting("context_shift", "ETSERVE_CONTEXT_SHIFT", "--context-shift", "0",
            "a generation that fills the context keeps the first --keep tokens, drops the oldest half of "
            "the rest and goes on (max_tokens may then exceed the room the prompt leaves); off: it stops "
            "with finish_reason length", switch=True),
    Setting("keep", "ETSERVE_KEEP", "--keep", "-1",
            "with --context-shift: tokens at the start of the context a shift never drops; -1: a chat's "
            "system turn (with its tools), nothing for completions"),
    Setting("max_tokens_cap", "ETSERVE_MAX_TOKENS_CAP", "--max-tokens-cap", "0",
            "most tokens one choice may generate, whatever max_tokens asks (like llama.cpp's -n); "
            "a capped choice ends with finish_reason length; 0: no cap"),
    Setting("sse_keepalive", "ETSERVE_SSE_KEEPALIVE", "--sse-keepalive", "10",
            "seconds of silence after which a stream gets an SSE comment (: keep-alive), e.g. while "
            "it waits for the model or its prompt is read; 0: never"),
    Setting("write_timeout", "ETSERVE_WRITE_TIMEOUT", "--write-timeout", "60",
            "seconds a write to (or read from) a client may block without progress before the connection "
            "is dropped and its generation cancelled: a client that stops reading a stream frees the "
            "engine; 0: never"),
    Setting("responses_store_size", "ETSERVE_RESPONSES_STORE_SIZE", "--responses-store-size", "100",
            "finished /v1/responses responses kept in memory (LRU) for GET /v1/responses/{id} and "
            "previous_response_id; 0: none are kept"),
    Setting("responses_store_mib", "ETSERVE_RESPONSES_STORE_MIB", "--responses-store-mib", "64",
            "memory (MiB) the stored /v1/responses responses may take, counted as their JSON (which echoes "
            "tools, metadata and the conversation); the least recently used go first; a response over a "
            "quarter of it is not kept"),
    Setting("tokenizer_path", "ETSERVE_TOKENIZER_PATH", "--tokenizer-path", "",
            "a tokenizer.json file, or a directory holding one, instead of the one beside the model; "
            "its tokenizer_config.json is read from the same directory if there is one"),
    Setting("hf_tokenizer", "ETSERVE_HF_TOKENIZER", "--hf-tokenizer", "",
            "a local Hugging Face tokenizer directory (tokenizer_config.json with the chat template, and "
            "tokenizer.json unless --tokenizer-path names one) instead of the files beside the model"),
    Setting("max_context", "ETSERVE_MAX_CONTEXT", "--max-context", "0",
            "context tokens the server uses, at most the .pte's max_seq_len; 0: all of it"),
    Setting("strict_model_name", "ETSERVE_STRICT_MODEL_NAME", "--strict-model-name", "0",
            "refuse (404) a request whose `model` is not the served model's id; by default a single-model "
            "server answers whatever name a client sends (clients hard-code names) and reports its own id",
            switch=True),
    Setting("no_think", "ETSERVE_NO_THINK", "--no-think", "0",
            "render chat templates with enable_thinking=false unless a request's chat_template_kwargs "
            "say otherwise", switch=True),
    Setting("allow_chatml_fallback", "ETSERVE_ALLOW_CHATML_FALLBACK", "--allow-chatml-fallback", "0",
            "for a tokenizer without a chat template, render chats as plain ChatML instead of "
            "refusing them", switch=True),
)

METRICS_AUTH_CHOICES = ("open", "key")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Settings:
    model: str
    model_path: str
    quantize: str
    model_id: str
    models_dir: str
    models_max: int
    models_mib: int
    host: str
    port: int
    threads: int
    prefill_chunk: int
    parallel: int
    prefill_step_ms: int
    sched_max_wait: float
    draft_max: int
    kv_cache_mib: int
    max_queue: int
    queue_timeout: int
    api_key: str
    metrics_auth: str
    cors_origins: str
    max_body_bytes: int
    session_cache_mib: int
    session_dir: str
    session_dir_mib: int
    context_shift: bool
    keep: int
    max_tokens_cap: int
    sse_keepalive: float
    write_timeout: float
    responses_store_size: int
    responses_store_mib: int
    tokenizer_path: str
    hf_tokenizer: str
    max_context: int
    strict_model_name: bool
    no_think: bool
    allow_chatml_fallback: bool

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        values = {s.name: env.get(s.env, s.default) for s in SETTINGS}
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for name, value in values.items():
            if types[name] in (bool, "bool"):
                if value.strip().lower() not in _TRUE + _FALSE:
                    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {value!r}")
                out[name] = value.strip().lower() in _TRUE
            elif types[name] in (int, "int"):
                try:
                    out[name] = int(value)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, got {value!r}") from None
            elif types[name] in (float, "float"):
                try:
                    out[name] = float(value)
                except ValueError:
                    raise ValueError(f"{name} must be a number, got {value!r}") from None
                if not 0 <= out[name] < float("inf"):
                    raise ValueError(f"{name} must be a finite number, 0 or more, got {value!r}")
            else:
                out[name] = value
        settings = cls(**out)
        settings.check()
        return settings

    def check(self) -> None:
        """What can be refused before anything loads: a value out of range, a model that is
        neither one this project builds nor a .gguf file (ValueError, naming the flag)."""
        if not 1 <= self.parallel <= 64:
            raise ValueError(f"--parallel must be 1 to 64 sequence slots, got {self.parallel}")
        if self.kv_cache_mib < -1:
            raise ValueError(f"--kv-cache-mib must be -1 (one context's worth) or 0 or more, got {self.kv_cache_mib}")
        if self.keep < -1:
            raise ValueError(f"--keep must be -1 (the system prompt's tokens) or 0 or more, got {self.keep}")
        if self.max_context < 0:
            raise ValueError(f"--max-context must be 0 (the whole context) or more, got {self.max_context}")
        if self.metrics_auth not in METRICS_AUTH_CHOICES:
            raise ValueError(f"--metrics-auth must be one of {', '.join(METRICS_AUTH_CHOICES)}, "
                             f"got {self.metrics_auth!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be 0 to 65535, got {self.port}")
        from app.models.registry import MODELS, check_quantize

        check_quantize(self.quantize)
        if not (self.model_path or self.models_dir or self.model.endswith(".gguf") or self.model in MODELS):
            raise ValueError(f"--model {self.model!r} is neither a model this project builds ({', '.join(MODELS)}) "
                             "nor a .gguf file; a built model directory is --model-path DIR")
