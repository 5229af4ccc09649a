// The sampling half of the C ABI: picks the next token from the logits of the
// last forward call, with per-request parameters and a caller-owned RNG state.
#include "etserve.h"
#include "model.h"
#include "kernel_table.h"  // vec::, the chosen CPU tier's reductions

// GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -W(maybe-)uninitialized reports where simd.h's reductions are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace {

// splitmix64: tiny, fast, and good enough to drive a categorical draw.
uint64_t next_u64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double next_unit(uint64_t* state) {  // uniform in [0, 1)
  return static_cast<double>(next_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

// log(sum(exp(x))) over a vocabulary: once per sampled token (its logprob), vectorized.
float log_sum_exp(const float* x, int64_t n) {
  const float mx = etserve::vec::max_of(x, n);
  if (!std::isfinite(mx)) return mx;
  return mx + static_cast<float>(std::log(etserve::vec::sum_exp_shift(x, n, mx)));
}

int32_t arg_max(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void apply_penalties(const ets_sampling& p, float* x, int64_t vocab) {
  bool any = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
             p.frequency_penalty != 0.0f;
  if (!any || p.history == nullptr || p.n_history <= 0) return;
  std::unordered_map<int32_t, int32_t> counts;
  counts.reserve(static_cast<size_t>(p.n_history));
  for (int32_t i = 0; i < p.n_history; ++i) {
    int32_t t = p.history[i];
    if (t >= 0 && t < vocab) ++counts[t];
  }
  for (const auto& [t, c] : counts) {
    float v = x[t];
    if (p.repetition_penalty != 1.0f) {
      v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
    v -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    x[t] = v;
  }
}

bool allowed_bit(const uint32_t* words, int64_t n_words, int64_t id) {
  return id / 32 < n_words && ((words[id / 32] >> (id % 32)) & 1u) != 0;
}

// Sets every token the mask excludes to -inf. If bias or penalties already
// pushed every allowed token to -inf, the allowed tokens get their raw logits
// back: the constraint outranks the preferences. False if nothing is allowed.
bool apply_mask(const uint32_t* words, int32_t n_words, const float* raw, float* x, int64_t vocab) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  int64_t allowed = 0, finite = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (allowed_bit(words, n_words, i)) {
      ++allowed;
      if (std::isfinite(x[i])) ++finite;
    } else {
      x[i] = neg_inf;
    }
  }
  if (allowed == 0) return false;
  if (finite == 0) {
    for (int64_t i = 0; i < vocab; ++i) {
      if (allowed_bit(words, n_words, i)) x[i] = raw[i];
    }
  }
  return true;
}

// Temperature, top-k, min-p and top-p over `x`, then one draw. `order` is
// scratch space for candidate ids, `w` for their weights (indexed by token id): each
// candidate's exp is computed once, over the whole vocabulary in one vectorized pass
// when no top-k narrows it.
int32_t draw(const ets_sampling& p, const float* x, int64_t vocab, std::vector<int32_t>& order,
             std::vector<float>& w, uint64_t* rng) {
  order.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto by_logit = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  size_t n = order.size();
  const bool top_k = p.top_k > 0 && static_cast<int64_t>(p.top_k) < vocab;
  if (top_k) {
    n = static_cast<size_t>(p.top_k);
    // A bounded heap over one pass (partial_sort) beats introselect's passes for usual k.
    if (n <= 4096) {
      std::partial_sort(order.begin(), order.begin() + static_cast<long>(n), order.end(), by_logit);
    } else {
      std::nth_element(order.begin(), order.begin() + static_cast<long>(n) - 1, order.end(), by_logit);
    }
  }
  float mx = -std::numeric_limits<float>::infinity();
  if (top_k) {
    for (size_t i = 0; i < n; ++i) mx = std::max(mx, x[order[i]]);
  } else {
    mx = etserve::vec::max_of(x, vocab);
  }
  if (!std::isfinite(mx)) return order[0];
  const float inv_t = static_cast<float>(1.0 / static_cast<double>(p.temperature));
  // Unnormalized weights; the best candidate has weight 1, a banned one 0.
  w.resize(static_cast<size_t>(vocab));
  double total = 0.0;
  if (top_k) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = order[i];
      const float a = (x[id] - mx) * inv_t;
      w[id] = a >= -87.0f ? std::exp(a) : 0.0f;
      total += w[id];
    }
  } else {
    total = etserve::vec::exp_weights(x, w.data(), vocab, mx, inv_t);
  }
  if (p.min_p > 0.0f) {  // keep candidates whose probability is >= min_p * the best one's
    size_t kept = 0;
    total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (w[order[i]] >= p.min_p) {
        total += w[order[i]];
        order[kept++] = order[i];
      }
    }
    n = std::max<size_t>(kept, 1);
  }

  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    // The nucleus: the fewest best candidates (by logit, then id) whose weights reach top_p of
    // the total. A peaked distribution reaches it within a sorted head of 256; a flat one
    // bisects the rest: order[0, lo) is known to be in, order[hi, n) out, and nth_element
    // splits [lo, hi) at its middle until it is small enough to sort.
    const double target = static_cast<double>(p.top_p) * total;
    size_t lo = 0, hi = n;
    double cum = 0.0;
    const size_t head = std::min<size_t>(n, 256);
    std::partial_sort(order.begin(), order.begin() + static_cast<long>(head), order.begin() + static_cast<long>(n),
                      by_logit);
    double head_sum = 0.0;
    for (size_t i = 0; i < head; ++i) head_sum += w[order[i]];
    if (head_sum >= target) {
      hi = head;
    } else {
      lo = head;
      cum = head_sum;
      while (hi - lo > 256) {
        const size_t mid = lo + (hi - lo) / 2;
        std::nth_element(order.begin() + static_cast<long>(lo), order.begin() + static_cast<long>(mid),
                         order.begin() + static_cast<long>(hi), by_logit);
        double s = 0.0;
        for (size_t i = lo; i < mid; ++i) s += w[order[i]];
        if (cum + s >= target) {
          hi = mid;
        } else {
          cum += s;
          lo = mid;
        }
      }
      std::sort(order.begin() + static_cast<long>(lo), order.begin() + static_cast<long>(hi), by_logit);
    }
    size_t cut = lo;
    while (cut < hi && cum < target) cum += w[order[cut++]];
    n = std::max<size_t>(cut, 1);
    total = cum > 0.0 ? cum : w[order[0]];
  }
  // The walk sums in another order than `total` did: if rounding leaves u >= 0 at the end,
  // the last candidate with a weight is drawn, never a banned one.
  double u = next_unit(rng) * total;
  int32_t last = order[0];
  for (size_t i = 0; i < n; ++i) {
    const float wi = w[order[i]];
    if (wi <= 0.0f) continue;
    last = order[i];
    u -= wi;
    if (u < 0.0) return last;
  }
  return last;
}

// One sample from `logits` (vocab floats): the whole of ets_sample but the model handle.
// On failure returns the status and sets *why.
int sample_logits(const float* logits, int64_t vocab, const ets_sampling* p, uint64_t* rng_state,
                  std::vector<float>& x, std::vector<int32_t>& order, std::vector<float>& w, int32_t* token_out,
                  float* logprob_out, const char** why) {
  if (!(p->temperature >= 0.0f) || !(p->top_p >= 0.0f) || !(p->min_p >= 0.0f) ||
      p->top_k < 0 || !(p->repetition_penalty > 0.0f)) {
    *why = "invalid sampling parameters";
    return ETS_ERR_INVALID_ARGUMENT;
  }
  x.assign(logits, logits + vocab);
  if (p->n_bias > 0) {
    if (p->bias_ids == nullptr || p->bias_values == nullptr) {
      *why = "logit bias arrays are missing";
      return ETS_ERR_INVALID_ARGUMENT;
    }
    for (int32_t i = 0; i < p->n_bias; ++i) {
      int32_t id = p->bias_ids[i];
      if (id < 0 || id >= vocab) {
        *why = "logit bias names a token outside the vocabulary";
        return ETS_ERR_INVALID_ARGUMENT;
      }
      // OpenAI semantics: -100 bans the token outright.
      float b = p->bias_values[i];
      x[static_cast<size_t>(id)] = b <= -100.0f ? -std::numeric_limits<float>::infinity()
                                                : x[static_cast<size_t>(id)] + b;
    }
  }
  apply_penalties(*p, x.data(), vocab);
  if (p->allowed != nullptr) {
    if (p->n_allowed_words <= 0) {
      *why = "the token mask is empty";
      return ETS_ERR_INVALID_ARGUMENT;
    }
    if (!apply_mask(p->allowed, p->n_allowed_words, logits, x.data(), vocab)) {
      *why = "the token mask allows no token of this vocabulary";
      return ETS_ERR_INVALID_ARGUMENT;
    }
  }
  int32_t token = p->temperature <= 0.0f ? arg_max(x.data(), vocab)
                                         : draw(*p, x.data(), vocab, order, w, rng_state);
  *token_out = token;
  if (logprob_out != nullptr) *logprob_out = logits[token] - log_sum_exp(logits, vocab);
  return ETS_OK;
}

}  // namespace

#ifndef ETSERVE_TEST_HOOKS  // the ABI over a model; the test library's copy has only the core above
extern "C" int ets_sample(ets_model* m, const ets_sampling* p, uint64_t* rng_state,
                          int32_t* token_out, float* logprob_out) {
  if (m == nullptr || p == nullptr || rng_state == nullptr || token_out == nullptr) {
    return ETS_ERR_INVALID_ARGUMENT;
  }
  if (!m->has_logits) return m->fail(ETS_ERR_STATE, "no forward call has produced logits yet");
  const char* why = "";
  int status = sample_logits(m->logits.data(), m->info.vocab_size, p, rng_state, m->scratch, m->order,
                             m->weights, token_out, logprob_out, &why);
  return status == ETS_OK ? ETS_OK : m->fail(status, why);
}


extern "C" int ets_top_logprobs(ets_model* m, int32_t k, int32_t* ids_out, float* logprobs_out) {
  if (m == nullptr || ids_out == nullptr || logprobs_out == nullptr || k < 0) {
    return ETS_ERR_INVALID_ARGUMENT;
  }
  if (!m->has_logits) return m->fail(ETS_ERR_STATE, "no forward call has produced logits yet");
  const int64_t vocab = m->info.vocab_size;
  const float* raw = m->logits.data();
  const size_t n = static_cast<size_t>(std::min<int64_t>(k, vocab));
  std::vector<int32_t>& order = m->order;
  order.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  auto by_logit = [raw](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(n), order.end(), by_logit);
  const float lse = log_sum_exp(raw, vocab);
  for (size_t i = 0; i < n; ++i) {
    ids_out[i] = order[i];
    logprobs_out[i] = raw[order[i]] - lse;
  }
  return ETS_OK;
}

#else
// Built into libetserve_test.so only (native/Makefile compiles this file again with
// ETSERVE_TEST_HOOKS for it): `n` draws of the sampler over caller-given logits (the rng state runs on from one
// to the next), so tests can check its distribution against a reference without a model
// (tests/native/test_sampler.py). logprobs_out may be NULL.
extern "C" ETS_API int etserve_test_sample(const float* logits, int64_t vocab, const ets_sampling* p,
                                           uint64_t* rng_state, int32_t n, int32_t* tokens_out,
                                           float* logprobs_out) {
  if (logits == nullptr || vocab < 1 || p == nullptr || rng_state == nullptr || n < 0 ||
      tokens_out == nullptr) {
    return ETS_ERR_INVALID_ARGUMENT;
  }
  std::vector<float> scratch;
  std::vector<int32_t> order;
  std::vector<float> weights;
  const char* why = "";
  for (int32_t i = 0; i < n; ++i) {
    int status = sample_logits(logits, vocab, p, rng_state, scratch, order, weights, tokens_out + i,
                               logprobs_out != nullptr ? logprobs_out + i : nullptr, &why);
    if (status != ETS_OK) return status;
  }
  return ETS_OK;
}
#endif  // ETSERVE_TEST_HOOKS
