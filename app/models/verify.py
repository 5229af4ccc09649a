"""Check a built ``model.pte`` (via the ExecuTorch pybinding) against a reference: transformers on
the same GGUF (fp32 builds), or the exporter's own eager module with the build's quantization
(``app/models/eager.py``; quantized builds).

Build-time tool: needs torch, executorch and transformers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

DEFAULT_PROMPT = "Tell me a short story about a robot who learns to paint."


def load_tokenizer(model_dir: Path):
    """The model directory's tokenizer as a transformers fast tokenizer (also checks it loads)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(model_dir))


def chat_prompt_ids(tokenizer, user: str) -> list[int]:
    """Token ids of a one-turn chat rendered with the model's template, ready for generation."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class PteRunner:
    """Drive a ``.pte`` through the pybinding: prefill once at pos 0, then one token per call."""

    def __init__(self, pte: Path, custom_ops: bool, quantized_ops: bool = False) -> None:
        import torch  # noqa: F401  the pybinding's tensors are torch tensors

        if custom_ops:
            import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  loads the torch ops + ET kernels
        if quantized_ops:
            import executorch.kernels.quantized  # noqa: F401  quantized_decomposed::embedding_4bit and kin
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        self.module = _load_for_executorch(str(pte))
        # a rows build (export.rows_example_inputs): positions per token and the rows to return
        self.rows = self.module.method_meta("forward").num_inputs() >= 3

    def metadata(self, name: str) -> Any:
        out = self.module.run_method(name, ())
        return out[0] if len(out) == 1 else list(out)

    def forward(self, tokens: Sequence[int], pos: int):
        import torch

        t = torch.tensor([list(tokens)], dtype=torch.long)
        if self.rows:
            p = torch.arange(pos, pos + len(tokens), dtype=torch.long)
            out = self.module.forward((t, p, torch.tensor([len(tokens) - 1], dtype=torch.long)))[0]
            return out.reshape(-1, out.shape[-1])[-1].float()  # [vocab] logits of the last position
        p = torch.tensor([pos], dtype=torch.long)
        return self.module.forward((t, p))[0][0].float()  # [vocab] logits of the last position


class HfRunner:
    """The fp32 transformers model loaded from the GGUF, with a KV cache."""

    def __init__(self, gguf_path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        ).eval()
        self.past = None

    def forward(self, tokens: Sequence[int], pos: int):
        import torch

        if pos == 0:
            self.past = None
        with torch.no_grad():
            out = self.model(torch.tensor([list(tokens)]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].float()


class EagerRunner:
    """ExecuTorch's eager llama module with the same source transforms as the build, KV cache inside."""

    def __init__(self, model_dir: Path) -> None:
        import shutil
        import tempfile

        from .eager import load_eager_model

        work = Path(tempfile.mkdtemp(prefix="etserve-eager-"))  # no "8da4w"/"int8" in the path
        try:
            self.model = load_eager_model(model_dir, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def forward(self, tokens: Sequence[int], pos: int):
        import torch

        with torch.no_grad():
            out = self.model(torch.tensor([list(tokens)], dtype=torch.long), {"input_pos": torch.tensor([pos])})
        if isinstance(out, tuple):
            out = out[0]
        return out[0, -1].float()  # it returns every position's logits


def greedy(forward: Callable, prompt: list[int], n: int, eos: set[int]) -> tuple[list[int], Any, float, float]:
    """Greedy decode until ``n`` tokens or an id in ``eos``; returns (tokens, prefill logits, prefill s, decode s)."""
    t0 = time.perf_counter()
    logits = forward(prompt, 0)
    t1 = time.perf_counter()
    first = logits
    out: list[int] = []
    pos = len(prompt)
    while len(out) < n:
        tok = int(logits.argmax())
        out.append(tok)
        if tok in eos or len(out) == n:
            break
        logits = forward([tok], pos)
        pos += 1
    return out, first, t1 - t0, time.perf_counter() - t1


def verify(
    name: str,
    model_dir: Path,
    prompt: Optional[str] = None,
    new_tokens: int = 32,
    reference: bool = True,
    ignore_eos: bool = False,
    stream=sys.stdout,
    against: str = "auto",
) -> dict[str, Any]:
    """Run the ``.pte`` (and a reference); print and return a report.

    ``against``: "transformers" (the fp32 model), "eager" (the exporter's eager module with the
    same quantization), or "auto": transformers for an fp32 build, eager for a quantized one."""
    from .manifest import read_manifest
    from .gguf_source import locate_gguf
    from .registry import get_spec

    manifest = read_manifest(model_dir)
    if manifest is None:
        raise FileNotFoundError(f"no complete build in {model_dir} (run: python -m app.models build {name} ...)")
    tokenizer = load_tokenizer(model_dir)
    ids = chat_prompt_ids(tokenizer, prompt or DEFAULT_PROMPT)
    eos = set() if ignore_eos else set(manifest["eos_token_ids"])

    pte = PteRunner(model_dir / "model.pte", manifest["custom_ops"],
                    quantized_ops=manifest.get("embedding_quantize", "none") != "none")
    report: dict[str, Any] = {
        "model_dir": str(model_dir),
        "prompt_tokens": len(ids),
        "metadata": {k: pte.metadata(k) for k in ("get_max_seq_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
                                                   "use_kv_cache", "enable_dynamic_shape", "use_sdpa_with_kv_cache")},
    }
    toks, logits, t_prefill, t_decode = greedy(pte.forward, ids, new_tokens, eos)
    report.update(
        pte_text=tokenizer.decode(toks, skip_special_tokens=False),
        pte_tokens=toks,
        prefill_tok_s=round(len(ids) / t_prefill, 1),
        decode_tok_s=round((len(toks) - 1) / t_decode, 1) if len(toks) > 1 and t_decode > 0 else None,
    )
    quantized = manifest["quantize"] != "none" or manifest.get("embedding_quantize", "none") != "none"
    if against == "auto":
        against = "eager" if quantized else "transformers"
    if against not in ("transformers", "eager"):
        raise ValueError(f"unknown reference {against!r}")
    if reference:
        ref = EagerRunner(model_dir) if against == "eager" else HfRunner(locate_gguf(get_spec(name)))
        ref_toks, ref_logits, _, _ = greedy(ref.forward, ids, new_tokens, eos)
        mismatch = next((i for i, (a, b) in enumerate(zip(toks, ref_toks)) if a != b), None)
        if mismatch is None and len(toks) != len(ref_toks):
            mismatch = min(len(toks), len(ref_toks))
        report.update(
            reference=against,
            max_abs_diff=float((logits - ref_logits).abs().max()),
            ref_logit_range=float(ref_logits.abs().max()),
            same_argmax=int(logits.argmax()) == int(ref_logits.argmax()),
            greedy_match=mismatch is None,
            first_mismatch=mismatch,
            ref_text=tokenizer.decode(ref_toks, skip_special_tokens=False),
        )
        # Same weights must agree; a quantized model against fp32 transformers is only reported on.
        report["ok"] = report["same_argmax"] if (against == "eager" or not quantized) else True
    print(json.dumps(report, indent=2, ensure_ascii=False), file=stream)
    return report
