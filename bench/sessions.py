"""What sessions save: time to first token of a conversation's second turn after
another conversation took the model, with the first turn's KV state restored
(warm) or prefilled again (cold); and what a switch costs natively.

    python bench/sessions.py [MODEL_DIR] [--history 1500] [--threads 2] [--repeat 2]

MODEL_DIR defaults to the default model's build (Qwen2.5-Coder-0.5B, ctx 2048,
8da4w, custom ops). The HTTP part serves it with the real gunicorn config on a
free port; the native part (snapshot / restore / prefill of the same number
of positions) runs in this process once the server has stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.client import chat, get_json  # noqa: E402
from bench.models import default_model_dir  # noqa: E402
from bench.prompts import filler, history_messages, load_tokenizer  # noqa: E402
from bench.servers import EtServe  # noqa: E402


def turn2_ttft(server: EtServe, model_dir: Path, history: int, repeat: int, other_tokens: int | None = None) -> dict:
    """Turn 2 of a conversation with a `history`-token first turn, after another conversation
    (`other_tokens`, default the same size) took the model: cold (nothing saved for it), then
    warm (its session restored)."""
    tokenizer, template = load_tokenizer(model_dir)
    first = history_messages(tokenizer, template, "alpha", history)
    other = history_messages(tokenizer, template, "beta", other_tokens or history)
    rows = []
    for _ in range(repeat):
        warm_id, other_id = f"warm-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
        reply = chat(server.url, first, warm_id, 48)
        turn2 = first + [{"role": "assistant", "content": reply.text},
                         {"role": "user", "content": "Add type hints to the first function."}]
        chat(server.url, other, other_id, 8)  # another conversation takes the cache
        warm = chat(server.url, turn2, warm_id, 8)  # turn 1 restored, only the new turn prefilled
        # Cold: the same turn with nothing saved that shares more than the template's first tokens.
        # An anonymous or unknown session starts from the saved state sharing the longest prefix
        # with its prompt, so this conversation's states go first, and the other one takes the cache.
        requests.delete(f"{server.url}/v1/sessions/{warm_id}", timeout=30).raise_for_status()
        chat(server.url, other, other_id, 8)
        cold = chat(server.url, turn2, f"cold-{uuid.uuid4().hex[:6]}", 8)
        requests.delete(f"{server.url}/v1/sessions/{other_id}", timeout=30)
        rows.append({
            "prompt_tokens": warm.usage["prompt_tokens"],
            "turn1_tokens": reply.usage["prompt_tokens"] + reply.usage["completion_tokens"],
            "cold_cached": cold.usage["prompt_tokens_details"]["cached_tokens"],
            "warm_cached": warm.usage["prompt_tokens_details"]["cached_tokens"],
            "cold_ttft_s": round(cold.ttft, 3),
            "warm_ttft_s": round(warm.ttft, 3),
            "ratio": round(warm.ttft / cold.ttft, 4),
            "same_text": warm.text == cold.text,
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"rows": rows, "ratio_median": statistics.median(r["ratio"] for r in rows)}


def http_part(model_dir: Path, history: int, threads: int, repeat: int) -> dict:
    server = EtServe(model_dir, threads)
    try:
        result = turn2_ttft(server, model_dir, history, repeat)
        listing = get_json(server.url, "/v1/sessions")
    finally:
        server.stop()
    return {**result, "sessions_used_mib": round(listing["used_bytes"] / 2**20, 1)}


def native_part(model_dir: Path, positions: int, threads: int, reps: int = 5) -> dict:
    from app.engine import NativeModel, set_num_threads

    set_num_threads(threads)
    model = NativeModel(model_dir / "model.pte")
    ids = filler(positions, model.info.vocab_size)
    chunk = min(128, model.info.max_prefill_len)
    t0 = time.perf_counter()
    for pos in range(0, positions, chunk):
        model.forward(ids[pos:pos + chunk], pos)
    prefill_s = time.perf_counter() - t0
    info = model.kv_info()
    snaps, restores = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        data = model.kv_snapshot(positions)
        snaps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.kv_restore(positions, data)
        restores.append(time.perf_counter() - t0)
    model.close()
    return {
        "positions": positions,
        "n_caches": info.n_caches,
        "bytes_per_position": info.bytes_per_position,
        "snapshot_mib": round(positions * info.bytes_per_position / 2**20, 1),
        "snapshot_ms": round(statistics.median(snaps) * 1000, 2),
        "restore_ms": round(statistics.median(restores) * 1000, 2),
        "prefill_ms": round(prefill_s * 1000, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", type=Path, default=None)
    p.add_argument("--history", type=int, default=1500, help="tokens of the first turn's prompt")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--skip-http", action="store_true")
    args = p.parse_args()
    model = args.model or default_model_dir()
    if not (model / "model.pte").exists():
        raise SystemExit(f"no model at {model}")
    if not args.skip_http:
        http = http_part(model, args.history, args.threads, args.repeat)
        print(f"turn-2 time to first token, warm / cold: {http['ratio_median']:.3f} "
              f"(median of {len(http['rows'])}; target <= 0.15); saved sessions: {http['sessions_used_mib']} MiB")
    native = native_part(model, args.history, args.threads)
    print(json.dumps(native))
    print(f"switch cost at {native['positions']} positions: snapshot {native['snapshot_ms']} ms + restore "
          f"{native['restore_ms']} ms vs prefill {native['prefill_ms']} ms "
          f"({native['snapshot_mib']} MiB, {native['bytes_per_position']} bytes/position)")


if __name__ == "__main__":
    main()
