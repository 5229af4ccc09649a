/*
 * etserve native runtime: a plain C ABI over the ExecuTorch Module API, for
 * ctypes. One ets_model owns one loaded .pte (memory-mapped) and the logits of
 * its last forward call. Calls on one model must be serialized by the caller;
 * every call returns an error code and never aborts the process on bad input.
 */
#ifndef ETSERVE_H
#define ETSERVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ETS_API __attribute__((visibility("default")))

/* Status codes. ETS_OK is 0; on any other code the model's error string says why. */
enum {
  ETS_OK = 0,
  ETS_ERR_INVALID_ARGUMENT = 1,
  ETS_ERR_OUT_OF_RANGE = 2,
  ETS_ERR_RUNTIME = 3,
  ETS_ERR_STATE = 4,
  ETS_ERR_UNSUPPORTED = 5, /* the model cannot do this at all (e.g. KV snapshots) */
};

typedef struct ets_model ets_model;

typedef struct {
  int64_t vocab_size;
  int64_t max_seq_len;      /* KV cache length: positions 0 .. max_seq_len-1 (the file's
                               get_max_context_len, else its get_max_seq_len) */
  int64_t max_context_len;  /* equals max_seq_len */
  int64_t max_prefill_len;  /* most tokens one forward call accepts */
  int64_t bos_id;           /* -1 when the file has none */
  int64_t n_eos;
  int64_t eos_ids[8];
  int32_t use_kv_cache;
  int32_t dynamic_shape;
  int32_t positions_are_vector; /* forward takes cache positions [S] instead of [1] */
  int32_t logits_dtype;        /* ExecuTorch ScalarType code of the output */
  int64_t max_rows;            /* a rows build (ets_forward_rows): most rows one call takes; 0: none */
} ets_model_info;

/* Sampling parameters, applied in this order: logit bias, repetition /
 * presence / frequency penalties over `history`, the allowed-token mask, then greedy (temperature <= 0)
 * or temperature -> top-k -> min-p -> top-p -> draw. Neutral values:
 * top_k 0, top_p 1, min_p 0, repetition_penalty 1, penalties 0. */
typedef struct {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  const int32_t* history; /* token ids the penalties look at */
  int32_t n_history;
  const int32_t* bias_ids; /* logit_bias: token ids ... */
  const float* bias_values; /* ... and the value added to each */
  int32_t n_bias;
  /* Constrained decoding: token i may be drawn only if bit (i % 32) of
   * allowed[i / 32] is set; ids past n_allowed_words * 32 are excluded. NULL
   * allows every token. Applied after bias and penalties; if those leave no
   * allowed token with a finite logit, the allowed tokens' raw logits decide. */
  const uint32_t* allowed;
  int32_t n_allowed_words;
} ets_sampling;

/* The size of each struct above, for bindings to check their layout at load: out[0]
 * sizeof(ets_model_info), out[1] sizeof(ets_sampling). Writes min(n, count) entries and
 * returns the count (2). */
ETS_API int ets_abi_sizes(int64_t* out, int n);

/* Routes the runtime's log: level 0 debug .. 3 error; below `min_level` dropped. */
ETS_API void ets_set_log_level(int min_level);

/* Sets the thread count of the runtime's shared pool (0: one per core). */
ETS_API int ets_set_num_threads(int num_threads);
ETS_API int ets_get_num_threads(void);

/* The attention kernel over int8 KV caches: `want` 0 generic (AVX2), 1 Intel AMX
 * tiles, -1 no change. Returns the kernel in use (0 or 1), or -1 when AMX was asked
 * for and the CPU or OS lacks it. Default: AMX where supported, unless the
 * environment sets ETSERVE_ATTENTION=generic. */
ETS_API int ets_attention_kernel(int want);

/* The vector instructions of the kernel set this process runs (chosen at load from the CPU):
 * "avx512-vnni", "avx2" or "scalar" on x86-64; "neon-dotprod", "neon" or "scalar" on aarch64. */
ETS_API const char* ets_vector_isa(void);

/* Opens a .pte and loads its forward method; NULL on failure with `err` filled
 * (operators the program needs but this runtime lacks are named there). */
ETS_API ets_model* ets_model_open(const char* path, char* err, size_t err_len);
ETS_API void ets_model_close(ets_model* m);
ETS_API const char* ets_model_error(const ets_model* m);
ETS_API int ets_model_get_info(const ets_model* m, ets_model_info* out);

/* Runs forward over tokens[0..n) at positions start_pos.. and keeps the logits
 * of the last position. Refuses n < 1, n > max_prefill_len, or a range past
 * the KV cache. */
ETS_API int ets_forward(ets_model* m, const int64_t* tokens, int64_t n, int64_t start_pos);

/* A rows call (rows builds: info.max_rows > 0): token r at cache position positions[r] of
 * sequence slot slots[r], for r < n <= max_rows, with logits kept for every row. Rows of one
 * slot at consecutive positions, next to each other, attend causally within themselves like a
 * prefill chunk (a speculative draft); other rows see only their own slot up to their own
 * position (decode steps of several sequences in one call, reading the weights once). Refuses
 * a position outside the cache, a slot that does not exist, two rows for one position of one
 * slot, and any call before a plain forward call has found the caches (ETS_ERR_STATE).
 * Afterwards ets_use_row chooses the row the sampler and ets_get_logits read. */
ETS_API int ets_forward_rows(ets_model* m, const int64_t* tokens, const int64_t* positions,
                             const int32_t* slots, int64_t n);

/* Makes row `row` of the last rows call the logits ets_sample, ets_top_logprobs and
 * ets_get_logits read. */
ETS_API int ets_use_row(ets_model* m, int64_t row);

/* Copies the last logits (vocab_size floats) into `out`. */
ETS_API int ets_get_logits(ets_model* m, float* out, int64_t n);

/* Total forward calls and tokens processed since open (for tests and metrics). */
ETS_API int64_t ets_forward_calls(const ets_model* m);
ETS_API int64_t ets_forward_tokens(const ets_model* m);

/* Where the model's memory is. planned: the forward method's memory-planned
 * buffers (activations and KV caches), their bytes and how many of those are
 * resident in transparent huge pages now (pages are faulted in as they are
 * used; both -1 when the runtime's own buffers are used because our mapping
 * failed); loaded_huge: what the load allocated on the heap (a delegate's
 * packed weights) that was moved into huge pages. 0 where the kernel has none;
 * collapse_refused: the errno the kernel refused that move with (EINVAL: no
 * MADV_COLLAPSE before Linux 6.1; EAGAIN or ENOMEM: no free huge page, memory
 * fragmented), 0 if it did not. */
ETS_API int ets_model_memory(const ets_model* m, int64_t* planned, int64_t* planned_huge, int64_t* loaded_huge,
                             int64_t* collapse_refused);

/* Samples one token from the last logits. `rng_state` is the caller's
 * per-request generator state (any value works as a seed). Writes the id to
 * *token_out and, if logprob_out is not NULL, its log-probability under the
 * model's (unbiased, untempered) distribution. */
ETS_API int ets_sample(ets_model* m, const ets_sampling* p, uint64_t* rng_state,
                       int32_t* token_out, float* logprob_out);

/* The k most likely tokens of the last logits under the model's own
 * distribution (before bias, penalties and temperature), most likely first.
 * Writes min(k, vocab_size) entries; returns ETS_OK. */
ETS_API int ets_top_logprobs(ets_model* m, int32_t k, int32_t* ids_out, float* logprobs_out);

/* KV cache snapshots, for keeping several conversations on one weight load.
 * The caches are found at run time: every write into them goes through
 * etserve's llama::update_cache / llama::sdpa_with_kv_cache kernels, which
 * report the cache tensors ([1, max_seq_len, n_kv_heads, head_dim], any
 * dtype) during the first successful forward call. Until then these calls
 * return ETS_ERR_STATE; for a model whose caches those kernels never write
 * (exported without the LLM custom ops) or write by index (ring buffers),
 * ETS_ERR_UNSUPPORTED. The reason is in ets_model_error.
 *
 * ets_kv_info: the number of caches and the bytes one position takes in all
 * of them together. */
ETS_API int ets_kv_info(ets_model* m, int64_t* n_caches, int64_t* bytes_per_position);

/* Copies rows [0, n_positions) of every cache into `out` (at least
 * n_positions * bytes_per_position bytes), cache after cache. */
ETS_API int ets_kv_snapshot(ets_model* m, int64_t n_positions, void* out, size_t out_len);

/* Writes rows [0, n_positions) of every cache back from a snapshot of `in_len`
 * bytes (a snapshot of in_len / bytes_per_position >= n_positions positions:
 * a prefix of a longer snapshot can be restored). Rows from n_positions on are
 * left as they are; the next forward call must start at a position <=
 * n_positions. The last logits are dropped. */
ETS_API int ets_kv_restore(ets_model* m, int64_t n_positions, const void* in, size_t in_len);

/* Sequence slots: several KV states on one weight load, for serving several
 * requests a step at a time. Slot 0 is the program's own caches; slots
 * 1..n-1 are buffers of the same shapes, memory used only as their positions
 * are written. Forward calls and the ets_kv_snapshot / ets_kv_restore calls
 * act on the selected slot (0 until another is selected); switching is a
 * pointer change, nothing is copied. Needs the caches discovered (as the
 * snapshots do): ETS_ERR_STATE before the first forward call, ETS_ERR_UNSUPPORTED
 * for models whose caches cannot be switched.
 *
 * ets_kv_slots: makes n >= 1 slots (fewer than now frees the last ones).
 * ets_kv_slot_count: how many there are (1 until ets_kv_slots). */
ETS_API int ets_kv_slots(ets_model* m, int n);
ETS_API int ets_kv_slot_count(const ets_model* m);

/* Selects the slot the next forward calls and snapshots use. The last logits
 * are dropped when the slot changes. */
ETS_API int ets_kv_select(ets_model* m, int slot);

/* Copies positions [0, n_positions) of every cache from slot `src` to slot
 * `dst` (a shared prompt prefix handed to another slot). */
ETS_API int ets_kv_copy(ets_model* m, int src, int dst, int64_t n_positions);

/* A slot's caches: their bytes (slot 0: the program's caches, in its planned
 * memory; another slot: its mapping) and, of those, the bytes in memory now. */
ETS_API int ets_kv_slot_memory(const ets_model* m, int slot, int64_t* reserved, int64_t* resident);

/* Gives back the memory of a slot's positions >= keep_positions (rounded up to
 * a 64-position block, and inward to whole pages) in every cache; what those
 * positions held is gone (they read as zeros). 0 gives back the whole slot.
 * Any slot, slot 0 included; the slot's last logits are dropped if it is the
 * selected one. */
ETS_API int ets_kv_slot_trim(ets_model* m, int slot, int64_t keep_positions);

#ifdef __cplusplus
}
#endif

#endif /* ETSERVE_H */
