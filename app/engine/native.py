"""ctypes binding to libetserve.so (native/): one class per C handle, 1:1 with etserve.h."""

from __future__ import annotations

import ctypes
import logging
import os
from array import array
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Sequence

from .sampling import SamplingParams

log = logging.getLogger("etserve")

_PACKAGE = Path(__file__).resolve().parents[1]
# Where the library is looked for unless ETSERVE_NATIVE_LIB names one: inside the installed
# package (a wheel ships it there with the ExecuTorch libraries it links, see setup.py), then
# the checkout's own build (`make -C native`).
_LIBRARY_PLACES = (_PACKAGE / "_native" / "libetserve.so", _PACKAGE.parent / "native" / "build" / "libetserve.so")


class Status(IntEnum):
    """The runtime's return codes (etserve.h's ETS_OK, ETS_ERR_*)."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_RANGE = 2
    RUNTIME = 3
    STATE = 4  # not yet: e.g. no forward call has found the KV caches
    UNSUPPORTED = 5  # never, for this model: e.g. KV snapshots


class NativeError(RuntimeError):
    """A call into the native runtime failed; the message is the runtime's own."""

    def __init__(self, message: str, code: int = Status.RUNTIME):
        super().__init__(message)
        try:
            self.code: Status | int = Status(code)
        except ValueError:  # a code this binding does not know: kept as the number
            self.code = code


class _Info(ctypes.Structure):
    _fields_ = [
        ("vocab_size", ctypes.c_int64),
        ("max_seq_len", ctypes.c_int64),
        ("max_context_len", ctypes.c_int64),
        ("max_prefill_len", ctypes.c_int64),
        ("bos_id", ctypes.c_int64),
        ("n_eos", ctypes.c_int64),
        ("eos_ids", ctypes.c_int64 * 8),
        ("use_kv_cache", ctypes.c_int32),
        ("dynamic_shape", ctypes.c_int32),
        ("positions_are_vector", ctypes.c_int32),
        ("logits_dtype", ctypes.c_int32),
        ("max_rows", ctypes.c_int64),
    ]


class _Sampling(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("history", ctypes.POINTER(ctypes.c_int32)),
        ("n_history", ctypes.c_int32),
        ("bias_ids", ctypes.POINTER(ctypes.c_int32)),
        ("bias_values", ctypes.POINTER(ctypes.c_float)),
        ("n_bias", ctypes.c_int32),
        ("allowed", ctypes.POINTER(ctypes.c_uint32)),
        ("n_allowed_words", ctypes.c_int32),
    ]


@dataclass(frozen=True)
class ModelInfo:
    """What the .pte says about itself (its metadata methods and forward signature)."""

    vocab_size: int
    max_seq_len: int
    max_context_len: int
    max_prefill_len: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    dynamic_shape: bool
    max_rows: int = 0  # a rows build: most rows one forward_rows call takes (0: not a rows build)


@dataclass(frozen=True)
class KvInfo:
    """The model's KV caches as the native side found them."""

    n_caches: int
    bytes_per_position: int  # one position in all caches together


@dataclass(frozen=True)
class MemoryInfo:
    planned: int  # bytes of the forward method's planned buffers (activations, KV caches); -1: the runtime's own
    planned_huge: int  # of those, resident in transparent huge pages now (-1 likewise)
    loaded_huge: int  # bytes the load allocated (a delegate's packed weights) moved into huge pages
    collapse_refused: int = 0  # errno the kernel refused that move with (EAGAIN: fragmented), 0 if it did not


def library_path() -> Path:
    """The libetserve.so this process loads: ETSERVE_NATIVE_LIB, else the first of _LIBRARY_PLACES."""
    explicit = os.environ.get("ETSERVE_NATIVE_LIB")
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise NativeError(f"native library not found at {path} (ETSERVE_NATIVE_LIB)")
        return path
    for path in _LIBRARY_PLACES:
        if path.exists():
            return path
    raise NativeError(f"native library not found at {' or '.join(map(str, _LIBRARY_PLACES))}: build it "
                      "with `make -C native` in a checkout, or install etserve's platform wheel")


_FLT_MIN = 1.1754943508222875e-38  # the smallest normal float32


def _load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p_model = ctypes.c_void_p
    sig = {
        "ets_abi_sizes": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]),
        "ets_set_log_level": (None, [ctypes.c_int]),
        "ets_set_num_threads": (ctypes.c_int, [ctypes.c_int]),
        "ets_get_num_threads": (ctypes.c_int, []),
        "ets_attention_kernel": (ctypes.c_int, [ctypes.c_int]),
        "ets_vector_isa": (ctypes.c_char_p, []),
        "ets_model_open": (p_model, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
        "ets_model_close": (None, [p_model]),
        "ets_model_error": (ctypes.c_char_p, [p_model]),
        "ets_model_get_info": (ctypes.c_int, [p_model, ctypes.POINTER(_Info)]),
        "ets_forward": (ctypes.c_int, [p_model, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int64]),
        "ets_get_logits": (ctypes.c_int, [p_model, ctypes.POINTER(ctypes.c_float), ctypes.c_int64]),
        "ets_forward_rows": (ctypes.c_int, [p_model, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                            ctypes.POINTER(ctypes.c_int32), ctypes.c_int64]),
        "ets_use_row": (ctypes.c_int, [p_model, ctypes.c_int64]),
        "ets_forward_calls": (ctypes.c_int64, [p_model]),
        "ets_forward_tokens": (ctypes.c_int64, [p_model]),
        "ets_model_memory": (ctypes.c_int, [p_model] + [ctypes.POINTER(ctypes.c_int64)] * 4),
        "ets_top_logprobs": (
            ctypes.c_int,
            [p_model, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)],
        ),
        "ets_kv_info": (ctypes.c_int, [p_model, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]),
        "ets_kv_snapshot": (ctypes.c_int, [p_model, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]),
        "ets_kv_restore": (ctypes.c_int, [p_model, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t]),
        "ets_kv_slots": (ctypes.c_int, [p_model, ctypes.c_int]),
        "ets_kv_slot_count": (ctypes.c_int, [p_model]),
        "ets_kv_select": (ctypes.c_int, [p_model, ctypes.c_int]),
        "ets_kv_copy": (ctypes.c_int, [p_model, ctypes.c_int, ctypes.c_int, ctypes.c_int64]),
        "ets_kv_slot_memory": (ctypes.c_int, [p_model, ctypes.c_int] + [ctypes.POINTER(ctypes.c_int64)] * 2),
        "ets_kv_slot_trim": (ctypes.c_int, [p_model, ctypes.c_int, ctypes.c_int64]),
        "ets_sample": (
            ctypes.c_int,
            [p_model, ctypes.POINTER(_Sampling), ctypes.POINTER(ctypes.c_uint64),
             ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)],
        ),
    }
    for name, (restype, argtypes) in sig.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise NativeError(f"{path} has no {name}: it is older than this binding; rebuild it with "
                              f"`make -C native`") from None
        fn.restype = restype
        fn.argtypes = argtypes
    check_abi(lib, path)
    return lib


# The ctypes mirror of each struct of etserve.h, in the order ets_abi_sizes reports them.
ABI_STRUCTS: tuple[tuple[str, type[ctypes.Structure]], ...] = (("ets_model_info", _Info), ("ets_sampling", _Sampling))


def check_abi(lib: ctypes.CDLL, path: os.PathLike | str = "the native library") -> None:
    """Refuse a library whose structs differ in size from this binding's (a stale build, or an
    etserve.h changed without native.py): ctypes would read and write past them silently."""
    sizes = (ctypes.c_int64 * len(ABI_STRUCTS))()
    count = lib.ets_abi_sizes(sizes, len(sizes))
    wrong = [f"{name}: {sizes[i]} bytes in the library, {ctypes.sizeof(struct)} in app/engine/native.py"
             for i, (name, struct) in enumerate(ABI_STRUCTS) if i < count and sizes[i] != ctypes.sizeof(struct)]
    if count != len(ABI_STRUCTS):
        wrong.append(f"the library reports {count} structs, the binding knows {len(ABI_STRUCTS)}")
    if wrong:
        raise NativeError(f"{path} does not match this binding ({'; '.join(wrong)}): rebuild it with "
                          f"`make -C native`, or update app/engine/native.py to etserve.h",
                          Status.INVALID_ARGUMENT)


_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The process-wide native library, loaded on first use."""
    global _lib
    if _lib is None:
        path = library_path()
        _lib = _load_library(path)
        log.info("native runtime: %s (CPU tier: %s kernels; attention over int8 KV caches: %s)", path.resolve(),
                 _lib.ets_vector_isa().decode(), int8_attention(_lib))
    return _lib


def int8_attention(lib: ctypes.CDLL) -> str:
    """Which kernels attend over int8 KV caches in this process: Intel AMX tiles where the CPU and
    OS have them (ets_attention_kernel); else one query row (a decode step) runs on the decode
    kernel of the CPU tier's set (native/src/attention_decode.cpp, _neon.cpp), which every set but
    the scalar one has, and longer rows on the generic tile."""
    if lib.ets_attention_kernel(-1) == 1:
        return "Intel AMX tiles"
    isa = lib.ets_vector_isa().decode()
    if isa == "scalar" or isa.startswith("generic"):
        return "generic"
    return f"{isa} decode kernel (one query row; generic tile for longer rows)"


def set_num_threads(n: int) -> int:
    """Resize the runtime's shared thread pool (0: one thread per core); returns the new size."""
    lib = library()
    if lib.ets_set_num_threads(n) != Status.OK:
        raise NativeError("cannot resize the runtime thread pool")
    return lib.ets_get_num_threads()


def _int32_array(values: Sequence[int]):
    return (ctypes.c_int32 * len(values))(*values) if values else None


class NativeModel:
    """One loaded .pte. Not thread-safe: the engine serializes every call."""

    def __init__(self, path: str | os.PathLike):
        self._lib = library()
        err = ctypes.create_string_buffer(4096)
        handle = self._lib.ets_model_open(os.fsencode(path), err, len(err))
        if not handle:
            raise NativeError(err.value.decode("utf-8", "replace"), Status.INVALID_ARGUMENT)
        self._handle = handle
        raw = _Info()
        self._check(self._lib.ets_model_get_info(handle, ctypes.byref(raw)))
        self.info = ModelInfo(
            vocab_size=raw.vocab_size,
            max_seq_len=raw.max_seq_len,
            max_context_len=raw.max_context_len,
            max_prefill_len=raw.max_prefill_len,
            bos_id=raw.bos_id if raw.bos_id >= 0 else None,
            eos_ids=tuple(raw.eos_ids[i] for i in range(raw.n_eos)),
            dynamic_shape=bool(raw.dynamic_shape),
            max_rows=raw.max_rows,
        )
        self._token = ctypes.c_int32()
        self._logprob = ctypes.c_float()
        self._rng = ctypes.c_uint64()

    def _check(self, status: int) -> None:
        if status != Status.OK:
            message = self._lib.ets_model_error(self._handle) or b"native call failed"
            raise NativeError(message.decode("utf-8", "replace"), status)

    def close(self) -> None:
        if self._handle:
            self._lib.ets_model_close(self._handle)
            self._handle = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    def forward(self, tokens: Sequence[int], start_pos: int) -> None:
        """Run tokens at positions start_pos.. and keep the last position's logits."""
        buf = (ctypes.c_int64 * len(tokens))(*tokens)
        self._check(self._lib.ets_forward(self._handle, buf, len(tokens), start_pos))

    def forward_rows(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> None:
        """A rows build: token r at position positions[r] of slot slots[r], logits kept for every row
        (use_row picks the one sample/top_logprobs/logits read). Rows of one slot at consecutive
        positions, next to each other, attend causally within themselves (a draft to verify)."""
        n = len(tokens)
        self._check(self._lib.ets_forward_rows(self._handle, (ctypes.c_int64 * n)(*tokens),
                                               (ctypes.c_int64 * n)(*positions), (ctypes.c_int32 * n)(*slots), n))

    def use_row(self, row: int) -> None:
        self._check(self._lib.ets_use_row(self._handle, row))

    def logits(self) -> array:
        out = array("f", bytes(4 * self.info.vocab_size))
        ptr = (ctypes.c_float * len(out)).from_buffer(out)
        self._check(self._lib.ets_get_logits(self._handle, ptr, len(out)))
        return out

    def sample(self, params: SamplingParams, rng_state: int, history: Sequence[int] = (),
               allowed: bytes | None = None) -> tuple[int, float, int]:
        """Pick the next token; returns (token id, its model logprob, next rng state).

        `allowed` is a token bitmask (bit i of little-endian 32-bit word i // 32 set:
        token i may be drawn), as a grammar matcher computes it; None allows all."""
        bias_ids = list(params.logit_bias)
        c = _Sampling(
            temperature=params.temperature,
            # a top_k of the vocabulary or more keeps every token: off (and it may not fit int32)
            top_k=params.top_k if params.top_k < self.info.vocab_size else 0,
            # a top_p of 0, or below float32's range, would reach the C struct as 0, which means
            # off: the smallest normal float keeps the best token, as any tiny top_p does
            top_p=max(params.top_p, _FLT_MIN),
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            n_history=0,
            n_bias=len(bias_ids),
        )
        if params.uses_history and history:
            hist = _int32_array(history)
            c.history = hist
            c.n_history = len(history)
        if bias_ids:
            ids = _int32_array(bias_ids)
            values = (ctypes.c_float * len(bias_ids))(*(params.logit_bias[i] for i in bias_ids))
            c.bias_ids = ids
            c.bias_values = values
        if allowed is not None:
            words = (ctypes.c_uint32 * (len(allowed) // 4)).from_buffer_copy(allowed)
            c.allowed = words
            c.n_allowed_words = len(words)
        self._rng.value = rng_state
        self._check(self._lib.ets_sample(self._handle, ctypes.byref(c), ctypes.byref(self._rng),
                                         ctypes.byref(self._token), ctypes.byref(self._logprob)))
        return self._token.value, self._logprob.value, self._rng.value

    def top_logprobs(self, k: int) -> list[tuple[int, float]]:
        """The k most likely next tokens under the model's own distribution, most likely first."""
        k = max(0, min(k, self.info.vocab_size))
        ids = (ctypes.c_int32 * k)()
        logprobs = (ctypes.c_float * k)()
        self._check(self._lib.ets_top_logprobs(self._handle, k, ids, logprobs))
        return list(zip(ids, logprobs))

    def kv_info(self) -> KvInfo:
        """The KV caches the first forward call found; NativeError (ETS_ERR_STATE) before
        that, or when the model's caches cannot be snapshotted."""
        n, per = ctypes.c_int64(), ctypes.c_int64()
        self._check(self._lib.ets_kv_info(self._handle, ctypes.byref(n), ctypes.byref(per)))
        return KvInfo(n.value, per.value)

    def kv_snapshot(self, n_positions: int, into: bytearray | None = None) -> bytearray:
        """Positions 0..n_positions-1 of every KV cache, as one buffer (`into`, resized,
        when given: reusing an old snapshot's memory spares faulting in fresh pages)."""
        size = n_positions * self.kv_info().bytes_per_position
        if into is None:
            out = bytearray(size)
        else:
            out = into
            if len(out) > size:
                del out[size:]
            elif len(out) < size:
                out.extend(bytes(size - len(out)))
        ptr = (ctypes.c_char * size).from_buffer(out) if size else None
        self._check(self._lib.ets_kv_snapshot(self._handle, n_positions, ptr, size))
        return out

    def kv_restore(self, n_positions: int, snapshot: bytes | bytearray) -> None:
        """Writes positions 0..n_positions-1 back from a snapshot of at least that many."""
        size = len(snapshot)
        if isinstance(snapshot, bytearray):
            ptr = (ctypes.c_char * size).from_buffer(snapshot) if size else None
        else:
            ptr = snapshot
        self._check(self._lib.ets_kv_restore(self._handle, n_positions, ptr, size))

    # sequence slots (etserve.h ets_kv_slots ...): several KV states, switched by pointer
    def set_slots(self, n: int) -> None:
        """Make `n` slots (slot 0: the program's own caches). Needs the caches found (one
        forward call): NativeError STATE before, UNSUPPORTED for models that cannot switch."""
        self._check(self._lib.ets_kv_slots(self._handle, n))

    @property
    def slot_count(self) -> int:
        return self._lib.ets_kv_slot_count(self._handle)

    def select_slot(self, slot: int) -> None:
        """Forward calls and snapshots act on `slot` from now on (the last logits are dropped)."""
        self._check(self._lib.ets_kv_select(self._handle, slot))

    def copy_slot(self, src: int, dst: int, n_positions: int) -> None:
        """Positions 0..n_positions-1 of every cache from slot `src` into slot `dst`."""
        self._check(self._lib.ets_kv_copy(self._handle, src, dst, n_positions))

    def slot_memory(self, slot: int) -> tuple[int, int]:
        """(bytes of the slot's caches, bytes of them in memory now); slot 0's are the program's
        own caches, in its planned memory."""
        reserved, resident = ctypes.c_int64(), ctypes.c_int64()
        self._check(self._lib.ets_kv_slot_memory(self._handle, slot, ctypes.byref(reserved),
                                                 ctypes.byref(resident)))
        return reserved.value, resident.value

    def trim_slot(self, slot: int, keep: int = 0) -> None:
        """Give back the memory of the slot's positions from `keep` on (rounded up to a block of
        64); what they held is gone. 0: the whole slot."""
        self._check(self._lib.ets_kv_slot_trim(self._handle, slot, keep))

    def memory(self) -> MemoryInfo:
        """Where the model's memory is: its planned buffers and how much of them, and of what
        the load allocated, is in transparent huge pages (etserve.h ets_model_memory)."""
        out = [ctypes.c_int64() for _ in range(4)]
        self._check(self._lib.ets_model_memory(self._handle, *map(ctypes.byref, out)))
        return MemoryInfo(*(x.value for x in out))

    @property
    def forward_calls(self) -> int:
        return self._lib.ets_forward_calls(self._handle)

    @property
    def forward_tokens(self) -> int:
        return self._lib.ets_forward_tokens(self._handle)
