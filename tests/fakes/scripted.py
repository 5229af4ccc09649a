"""A served model without a .pte, for fast hermetic tests of the HTTP layer.

The real `Engine` (its queue, admission, stop tokens, max_tokens, cancellation,
prefix reuse and sessions) runs over `ScriptedRuntime`, a stand-in for
`NativeModel` whose "KV cache" is the list of tokens forwarded so far and whose
sampler emits scripted replies. The served model around it is assembled by the
app's own `serve_model` from a tiny byte-level BPE tokenizer built here (most
text is one token per byte; a few words are one token, see WORDS) and a
ChatML chat template, so tokenization, templates, detokenization, stop
strings, tool parsing and grammars are all the real code.

Scripting tokens:

    fake = FakeModel()                       # or FakeModel(template=..., settings=...)
    fake.script.reply("Hello", ["Hi", " there", "!"])   # a prompt containing "Hello"
    fake.script.default(["OK"])              # anything else (the default default is "OK")
    client = fake.client()                   # falcon.testing.TestClient of build_app
    r = client.simulate_post("/v1/chat/completions", json={...})

A reply is a list of pieces; a str piece is emitted as the tokens it encodes to
(`fake.encode(text)` says which), an int piece as that token id. After the last
piece comes the end-of-turn token (<|im_end|>), unless the rule says
`then="repeat"`: then its last token repeats until max_tokens ends the choice.
A reply may also be a callable taking a `Turn` (the prompt's text and ids and
the choice's seed: with a request `seed`, choice i of n gets seed + i) and
returning the pieces. Each token's logprob is -0.5 * (its index in the reply +
1), and `top_logprobs` lists the emitted token first, then the next ids.

Under a grammar (response_format, forced tool_choice) a scripted token the
grammar does not allow is replaced by the smallest allowed id, as a real
sampler never leaves the mask; `fake.runtime.masked` counts those.

`fake.runtime.hold()` makes every forward call wait until `release()` (with a
timeout), so a test can keep one generation busy while others queue;
`fake.runtime.prompts` records each generation's prompt text in the order the
engine ran them. The Responses and Messages APIs can use the same fake: only
the route and the request shape differ.
"""

from __future__ import annotations

import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, Union

import falcon.testing

from app.engine.native import KvInfo, ModelInfo, NativeError
from app.text.tokenizer import Tokenizer, byte_decoder

# Words that are one token each (byte-level BPE merges built for them); everything else is one
# token per UTF-8 byte, so multi-byte characters span several tokens.
WORDS = ("Hello", " world", "Hi", " there", " answer", " is", "END", "STOP", "name", "arguments")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<tool_call>", "</tool_call>")  # Qwen-style tool markers: added (non-special) tokens
# Qwen2.5-Coder's fill-in-the-middle tokens, for FakeModel(fim=True)
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")

# ChatML whose generation prompt opens the thinking, as thinking models' templates do
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")

# ChatML that offers tools in the system turn (Hermes wording) and writes an assistant's
# calls back as <tool_call> blocks, like Qwen2.5's template does.
TOOLS_TEMPLATE = (
    "{% set ns = namespace(first=0) %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set ns.first = 1 %}{% endif %}"
    "{% if tools or ns.first %}{{ '<|im_start|>system\\n' }}"
    "{% if ns.first %}{{ messages[0]['content'] }}{% endif %}"
    "{% if tools %}{{ '\\n# Tools\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\nCall a function as <tool_call>\\n{\"name\": <name>, \"arguments\": <args>}\\n</tool_call>' }}"
    "{% endif %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages[ns.first:] %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ call['function']['arguments'] if call['function']['arguments'] is string "
    "else call['function']['arguments'] | tojson }}{{ '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

Piece = Union[str, int]


@dataclass(frozen=True)
class Turn:
    prompt: str  # the prompt's text (special tokens written out)
    prompt_ids: tuple[int, ...]
    seed: int  # the rng state the generation started from (a request's seed + the choice index)


@dataclass
class _Rule:
    when: Callable[[str], bool]
    reply: Callable[[Turn], Sequence[Piece]]
    then: str  # "eos" or "repeat"


class Script:
    """Which reply a prompt gets: the first rule whose `when` matches the prompt text."""

    def __init__(self, encode: Callable[[str], list[int]], eos_id: int):
        self._encode = encode
        self._eos = eos_id
        self._rules: list[_Rule] = []
        self._default = _Rule(lambda _: True, lambda _: ["OK"], "eos")

    @staticmethod
    def _rule(when, pieces, then) -> _Rule:
        match = when if callable(when) else (lambda text, s=when: s in text)
        reply = pieces if callable(pieces) else (lambda _turn, p=list(pieces): p)
        if then not in ("eos", "repeat"):
            raise ValueError("then is 'eos' or 'repeat'")
        return _Rule(match, reply, then)

    def reply(self, when: str | Callable[[str], bool], pieces, *, then: str = "eos") -> "Script":
        """Prompts containing `when` (or for which it returns True) get `pieces`."""
        self._rules.append(self._rule(when, pieces, then))
        return self

    def default(self, pieces, *, then: str = "eos") -> "Script":
        self._default = self._rule(lambda _: True, pieces, then)
        return self

    def clear(self) -> None:
        self._rules.clear()
        self._default = _Rule(lambda _: True, lambda _: ["OK"], "eos")

    def tokens(self, turn: Turn) -> tuple[list[int], str]:
        rule = next((r for r in self._rules if r.when(turn.prompt)), self._default)
        ids: list[int] = []
        for piece in rule.reply(turn):
            ids.extend([piece] if isinstance(piece, int) else self._encode(piece))
        if rule.then == "eos":
            ids.append(self._eos)
        return ids, rule.then


class ScriptedRuntime:
    """Stands in for NativeModel under the real Engine (same methods, same contracts)."""

    def __init__(self, tokenizer: Tokenizer, script: Script, *, vocab_size: int, max_seq_len: int,
                 max_prefill_len: int = 64, eos_ids: tuple[int, ...] = ()):
        self.info = ModelInfo(vocab_size=vocab_size, max_seq_len=max_seq_len, max_context_len=max_seq_len,
                              max_prefill_len=max_prefill_len, bos_id=None, eos_ids=eos_ids, dynamic_shape=True)
        self.tokenizer = tokenizer
        self.script = script
        self.prompts: list[str] = []  # each generation's prompt text, in the order they ran
        self.masked = 0
        self.forward_calls = 0
        self.forwards_started = 0
        self.forward_tokens = 0
        self.fail_next_forward: str | None = None  # the next forward raises NativeError with this text
        self._gate = threading.Event()
        self._gate.set()
        self._seqs = [_Sequence()]  # one per sequence slot, as a real runtime keeps a KV state per slot
        self._slot = 0
        self._kv_seen = False

    # the selected slot's state
    @property
    def _seq(self) -> "_Sequence":
        return self._seqs[self._slot]

    @property
    def kv(self) -> list[int]:
        """The tokens at positions 0..len-1 of the selected slot, as a real KV cache would hold them."""
        return self._seq.kv

    @kv.setter
    def kv(self, value: list[int]) -> None:
        self._seq.kv = value

    # -- test controls
    def hold(self) -> None:
        """Forward calls wait (up to 30 s) until release()."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    # -- the NativeModel interface
    def forward(self, tokens: Sequence[int], start_pos: int) -> None:
        self.forwards_started += 1  # (a held call counts as started)
        if not self._gate.wait(30):
            raise NativeError("ScriptedRuntime.hold() was never released", 3)
        if self.fail_next_forward is not None:
            message, self.fail_next_forward = self.fail_next_forward, None
            raise NativeError(message, 3)
        if not tokens or len(tokens) > self.info.max_prefill_len:
            raise NativeError(f"forward of {len(tokens)} tokens", 1)
        if start_pos > len(self.kv) or start_pos + len(tokens) > self.info.max_seq_len:
            raise NativeError(f"forward at {start_pos} with {len(self.kv)} positions filled", 2)
        decode = (len(tokens) == 1 and tokens[0] == self._seq.last and start_pos == len(self.kv)
                  and start_pos >= self._seq.prompt_end and self._seq.has_logits)
        # (a new prompt that is exactly the last prompt plus its reply so far continues that reply,
        # as a real model would: the sequence is the state)
        del self.kv[start_pos:]
        self.kv.extend(int(t) for t in tokens)
        self.forward_calls += 1
        self.forward_tokens += len(tokens)
        self._kv_seen = True
        self._seq.has_logits = True
        if not decode:  # a prompt (chunk): the reply starts after it
            self._seq.prompt_end = len(self.kv)
            self._seq.reply = []

    def sample(self, params, rng_state: int, history: Sequence[int] = (),
               allowed: bytes | None = None) -> tuple[int, float, int]:
        if not self._seq.has_logits:
            raise NativeError("no forward call has produced logits yet", 4)
        if not self._seq.reply:
            prompt = self.kv[: self._seq.prompt_end]
            text = self.tokenizer.decode(prompt)
            self.prompts.append(text)
            self._seq.reply, self._seq.then = self.script.tokens(Turn(text, tuple(prompt), rng_state))
            if not self._seq.reply:
                self._seq.reply = [self.script._eos]
            self._seq.emitted = 0
        i = self._seq.emitted
        token = self._seq.reply[i] if i < len(self._seq.reply) else self._seq.reply[-1]
        if allowed is not None and not _bit(allowed, token):
            self.masked += 1
            token = next(t for t in range(self.info.vocab_size) if _bit(allowed, t))
        self._seq.emitted += 1
        self._seq.last = token
        return token, -0.5 * (i + 1), rng_state

    def top_logprobs(self, k: int) -> list[tuple[int, float]]:
        k = max(0, min(k, self.info.vocab_size))
        first = self._seq.last if self._seq.last is not None else 0
        lp = -0.5 * self._seq.emitted
        return [((first + j) % self.info.vocab_size, lp - j) for j in range(k)]

    def logits(self):  # pragma: no cover - the engine never asks; here for the interface
        raise NativeError("ScriptedRuntime has no logits", 5)

    def kv_info(self) -> KvInfo:
        if not self._kv_seen:
            raise NativeError("no forward call has found the caches yet", 4)
        return KvInfo(1, 4)

    def kv_snapshot(self, n_positions: int, into: bytearray | None = None) -> bytearray:
        data = b"".join(t.to_bytes(4, "little") for t in self.kv[:n_positions])
        if into is None:
            return bytearray(data)
        into[:] = data
        return into

    def kv_restore(self, n_positions: int, snapshot: bytes | bytearray) -> None:
        if len(snapshot) < 4 * n_positions:
            raise NativeError("the snapshot is shorter than the positions to restore", 1)
        self.kv = [int.from_bytes(snapshot[4 * i: 4 * i + 4], "little") for i in range(n_positions)]
        self._seq.has_logits = False

    # sequence slots (NativeModel.set_slots ...)
    def set_slots(self, n: int) -> None:
        # (a real runtime needs one forward call first to find its caches; this one knows them)
        self._seqs = self._seqs[:n] + [_Sequence() for _ in range(n - len(self._seqs))]
        self._slot = min(self._slot, n - 1)

    @property
    def slot_count(self) -> int:
        return len(self._seqs)

    def select_slot(self, slot: int) -> None:
        if not 0 <= slot < len(self._seqs):
            raise NativeError(f"slot {slot} does not exist", 2)
        if slot != self._slot:
            self._seq.has_logits = False
        self._slot = slot

    def copy_slot(self, src: int, dst: int, n_positions: int) -> None:
        self._seqs[dst].kv = list(self._seqs[src].kv[:n_positions])
        self._seqs[dst].has_logits = False

    def slot_memory(self, slot: int) -> tuple[int, int]:
        return 4 * self.info.max_seq_len, 4 * len(self._seqs[slot].kv)  # 4 bytes a position

    def trim_slot(self, slot: int, keep: int = 0) -> None:
        seq = self._seqs[slot]
        seq.kv = seq.kv[:-(-keep // 64) * 64]  # whole blocks of 64, as the runtime
        if slot == self._slot:
            seq.has_logits = False

    def close(self) -> None:
        pass


@dataclass
class _Sequence:
    """One slot's state in the fake runtime: its "KV cache" and the reply it is emitting."""

    kv: list[int] = field(default_factory=list)
    reply: list[int] = field(default_factory=list)
    then: str = "eos"
    emitted: int = 0
    last: int | None = None
    prompt_end: int = 0
    has_logits: bool = False


def _bit(mask: bytes, token: int) -> bool:
    word = token // 32
    return 4 * word + 4 <= len(mask) and (int.from_bytes(mask[4 * word: 4 * word + 4], "little") >> (token % 32)) & 1


def tokenizer_json(words: Sequence[str] = WORDS, special: Sequence[str] = SPECIAL) -> str:
    """A byte-level BPE: one token per byte, plus one token for each of `words`."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    table = byte_decoder()
    alphabet = sorted(table, key=table.get)
    to_pieces = {b: c for c, b in table.items()}
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    for word in words:
        chars = [to_pieces[b] for b in word.encode("utf-8")]
        left = chars[0]
        for c in chars[1:]:
            if left + c not in vocab:
                merges.append((left, c))
                vocab[left + c] = len(vocab)
            left += c
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(special))
    hf.add_tokens(list(ADDED))
    return hf.to_str()


@dataclass
class FakeModel:
    """A ServedModel over ScriptedRuntime, and the app around it (see the module docstring)."""

    template: str | None = TOOLS_TEMPLATE
    settings: dict[str, str] = field(default_factory=dict)  # ETSERVE_* overrides
    max_seq_len: int = 1024
    extra_vocab: int = 16  # the model's logits cover more ids than the tokenizer (as real models' do)
    fim: bool = False  # the vocabulary has Qwen2.5-Coder's FIM tokens (repository ones too)

    def __post_init__(self):
        from app.model_host import serve_model
        from app.settings import Settings

        self._dir = tempfile.TemporaryDirectory(prefix="etserve-fake-")
        directory = Path(self._dir.name)
        (directory / "tokenizer.json").write_text(tokenizer_json(special=SPECIAL + (FIM if self.fim else ())),
                                                  encoding="utf-8")
        config = {"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False,
                  "model_max_length": self.max_seq_len}
        if self.template is not None:
            config["chat_template"] = self.template
        (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        tokenizer = Tokenizer.from_dir(directory)
        for word in WORDS:
            assert len(tokenizer.encode(word)) == 1, word
        eos = tokenizer.token_to_id("<|im_end|>")
        self.script = Script(tokenizer.encode, eos)
        self.runtime = ScriptedRuntime(tokenizer, self.script, vocab_size=tokenizer.vocab_size + self.extra_vocab,
                                       max_seq_len=self.max_seq_len, eos_ids=(eos,))
        env = {"ETSERVE_MODEL_PATH": str(directory), "ETSERVE_MODEL_ID": "fake-model",
               "ETSERVE_SSE_KEEPALIVE": "0", **self.settings}
        self.app_settings = Settings.from_env(env)
        self.served = serve_model(self.app_settings, self.runtime, directory, directory / "tokenizer.json",
                                  directory / "tokenizer_config.json")
        self.tokenizer = tokenizer
        self.eos_id = eos

    @property
    def engine(self):
        return self.served.engine

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def app(self) -> falcon.App:
        """build_app over this model, ready (the load ran) when returned."""
        import time

        from app.wsgi import build_app

        app = build_app(self.app_settings, lambda: self.served)
        client = falcon.testing.TestClient(app)
        deadline = time.monotonic() + 10
        while client.simulate_get("/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the fake model never became ready: {client.simulate_get('/health').text}")
            time.sleep(0.005)
        return app

    def client(self, headers: dict[str, str] | None = None) -> falcon.testing.TestClient:
        return falcon.testing.TestClient(self.app(), headers=headers)

    def close(self) -> None:
        self._dir.cleanup()
