"""The served .pte computes what the model is: logits against an independent fp32
reference, transformers loading the very GGUF our build converted."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import NativeModel
from app.models.manifest import read_manifest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def reference(model_dir):
    from app.models.gguf_source import locate_gguf
    from app.models.registry import get_spec

    manifest = read_manifest(model_dir)
    if manifest["quantize"] != "none":
        pytest.fail("the fidelity test needs an fp32 build of the test model")
    gguf = locate_gguf(get_spec(manifest["name"]))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    return model


def test_logits_and_greedy_continuation_match_transformers(model_dir, served_model, reference):
    text = served_model.template.render([{"role": "user", "content": "Explain what a prime number is."}])
    ids = served_model.tokenizer.encode(text)
    native = NativeModel(model_dir / "model.pte")

    with torch.no_grad():
        ref_logits = reference(torch.tensor([ids])).logits[0, -1].numpy()
    native.forward(ids, 0)
    ours = np.frombuffer(native.logits(), dtype=np.float32)
    diff = float(np.abs(ours - ref_logits).max())
    print(f"max abs logit diff vs transformers: {diff:.2e}")
    assert diff < 1e-3

    # Greedy continuation: ours token by token through the KV cache, theirs by generate().
    ours_tokens, pos = [], len(ids)
    token = int(np.argmax(ours))
    for _ in range(NEW_TOKENS):
        ours_tokens.append(token)
        native.forward([token], pos)
        pos += 1
        token = int(np.argmax(np.frombuffer(native.logits(), dtype=np.float32)))
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    theirs = out[0, len(ids):].tolist()
    assert ours_tokens == theirs
    native.close()
