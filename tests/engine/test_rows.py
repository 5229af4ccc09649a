"""Rows calls on the real builds (ets_forward_rows): tokens at their own positions in their own
sequence slots, logits for every row, each row bit for bit what a decode step of that token gives.

On the fp32 test model (SmolLM2, rows cache layout) and the default model (Qwen, 4-bit linears,
int8 caches, AMX tiles where the CPU has them): what batched decode and speculative decoding
(app/engine/batching.py) rely on for their output to be plain decoding's.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import NativeError, NativeModel


def logits(m: NativeModel) -> np.ndarray:
    return np.frombuffer(m.logits(), dtype=np.float32).copy()


@pytest.fixture(scope="module", params=["smollm2", "qwen"])
def model(request, model_dir, qwen_dir):
    path = model_dir if request.param == "smollm2" else qwen_dir
    m = NativeModel(path / "model.pte")
    assert m.info.max_rows >= 8, "the test builds are rows builds"
    m.forward([m.info.bos_id or 0], 0)  # a plain call finds the caches
    m.set_slots(3)
    yield m
    m.close()


A = [(1000 + 37 * i) % 20000 + 100 for i in range(150)]
B = [(3000 + 11 * i) % 20000 + 100 for i in range(70)]


def steps(m: NativeModel, slot: int, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The prompt, then each token as its own decode step: the logits after each token."""
    m.select_slot(slot)
    m.forward(prompt, 0)
    out = []
    for i, t in enumerate(tokens):
        m.forward([t], len(prompt) + i)
        out.append(logits(m))
    return out


def test_rows_give_each_rows_decode_step_bit_for_bit(model):
    m = model
    ref_a = steps(m, 1, A, [42, 43, 44, 45])
    ref_b = steps(m, 2, B, [77])
    # slot 1's four tokens at once (a draft to verify) and slot 2's next token (another sequence)
    m.forward_rows([42, 43, 44, 45, 77], [len(A), len(A) + 1, len(A) + 2, len(A) + 3, len(B)], [1, 1, 1, 1, 2])
    for row, ref in enumerate(ref_a + ref_b):
        m.use_row(row)
        np.testing.assert_array_equal(logits(m), ref, err_msg=f"row {row}")
    # the other order, single rows of each slot
    m.forward_rows([77, 42], [len(B), len(A)], [2, 1])
    m.use_row(0)
    np.testing.assert_array_equal(logits(m), ref_b[0])
    m.use_row(1)
    np.testing.assert_array_equal(logits(m), ref_a[0])


def test_a_rows_call_leaves_the_caches_a_decode_step_continues_from(model):
    m = model
    ref = steps(m, 1, A, [42, 43, 44])
    steps(m, 1, A, [])  # slot 1 back at the prompt
    m.forward_rows([42, 43], [len(A), len(A) + 1], [1, 1])  # two tokens written by a rows call
    m.select_slot(1)
    m.forward([44], len(A) + 2)  # the next decode step reads them
    np.testing.assert_array_equal(logits(m), ref[2])


def test_rows_calls_refuse_what_they_cannot_do(model):
    m = model
    n = m.info.max_seq_len
    with pytest.raises(NativeError, match="does not exist"):
        m.forward_rows([5], [0], [7])
    with pytest.raises(NativeError, match="two rows for position"):
        m.forward_rows([5, 6], [3, 3], [1, 1])
    with pytest.raises(NativeError, match="outside the KV cache"):
        m.forward_rows([5], [n], [1])
    with pytest.raises(NativeError, match="outside the vocabulary"):
        m.forward_rows([m.info.vocab_size], [0], [1])
    with pytest.raises(NativeError, match="at most"):
        k = m.info.max_rows + 1
        m.forward_rows([5] * k, list(range(k)), [1] * k)
    with pytest.raises(NativeError, match="not a row"):
        m.forward_rows([5], [0], [1])
        m.use_row(1)
    # and the model keeps working
    ref = steps(m, 2, B, [77])
    m.forward_rows([77], [len(B)], [2])
    m.use_row(0)
    np.testing.assert_array_equal(logits(m), ref[0])
