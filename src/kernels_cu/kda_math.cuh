// The per-token math of Kimi Delta Attention shared by the prefill (kda_prepare) and decode
// (kda_decode) kernels: L2 normalisation of q and k, the gate modes and the β forms. One place
// for these semantics, so prefill and decode compute exactly the same thing. A mode is a
// compile-time constant of the kernel (its spec), so no kernel body branches on it.
#pragma once
#include "common.cuh"

// The decode kernels' strides (elements) of the caller's q, k, g, v, beta and out, one struct
// passed by value: [batch, token, head] (beta's all three); the last dim is contiguous.
struct KdaDecodeLayout {
  long long q[3], k[3], g[3], v[3], beta[3], out[3];
};

constexpr float KDA_L2_EPS = 1e-6f;
constexpr float KDA_LOG2E = 1.4426950408889634f;

// Gate modes: how the log-decay a (natural log, <= 0) of one key dimension comes from g.
//   SAFE      a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias))       bounded: (lower_bound, 0)
//   SOFTPLUS  a = −exp(A_log) · softplus(g + dt_bias)                     Kimi Linear's, unbounded
//   NONE      a = g                                                         precomputed by the caller
enum KdaGate { KDA_GATE_SAFE = 0, KDA_GATE_SOFTPLUS = 1, KDA_GATE_NONE = 2 };
// β forms: LOGIT β = sigmoid(b); LOGIT2 β = 2·sigmoid(b) (negative eigenvalues); PROB β = b.
enum KdaBeta { KDA_BETA_LOGIT = 0, KDA_BETA_LOGIT2 = 1, KDA_BETA_PROB = 2 };

// Logistic function with the accurate expf: sigmoid(-inf) = 0, sigmoid(+inf) = 1, NaN stays NaN.
PYKDA_DEVICE float kda_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// log2(1 + e^x) = softplus(x)·log2 e on the fast intrinsics (ex2/lg2.approx), within 3e-5
// relative: x past 15 (the e^-x dropped is below fp32's resolution of x); log1p's series
// y (1 − y (1/2 − y/3))·log2 e with y = e^x below −4 (the y⁴/4 dropped is < 2e-6 of it; lg2's
// absolute error of 2^-22 would be large beside the smallest results); lg2(1 + e^x) between, where
// 1 + e^x >= 1.018 (its rounding < 7e-6 of the result). All three are computed and one selected:
// no branch per element (kda_prepare runs this on every element of g).
PYKDA_DEVICE float kda_log2_softplus(float x) {
  const float xl = x * KDA_LOG2E;
  const float y = fast_exp2(xl);   // e^x (flushed to 0 below e^-87: the result is then e^x·log2 e, ~0)
  const float series = y * (KDA_LOG2E - y * (0.5f * KDA_LOG2E - y * (KDA_LOG2E / 3.f)));
  const float logged = fast_log2(1.f + y);
  const float below = x < -4.f ? series : logged;
  return x > 15.f ? xl : below;
}

// Logistic function on the fast intrinsics, for the gate (2 ulp; 1/(1 + 2^+inf) = 0).
PYKDA_DEVICE float kda_fast_sigmoid(float x) { return fast_rcp(1.f + fast_exp2(-x * KDA_LOG2E)); }

// 1 / sqrt(Σx² + eps): multiply a row of q or k by this to L2-normalise it.
// (rsqrtf's result without its denormal path: the argument is at least KDA_L2_EPS)
PYKDA_DEVICE float kda_inv_norm(float sum_sq) { return fast_rsqrt(sum_sq + KDA_L2_EPS); }

// The factor a row of q or k is multiplied by: its inverse L2 norm when the kernel normalises,
// else 1 (the caller normalised, or wants none).
template <bool NORM> PYKDA_DEVICE float kda_row_scale(float sum_sq) { return NORM ? kda_inv_norm(sum_sq) : 1.f; }

// Log2-decay a·log2 e of one key dimension (a: the natural log-decay; the kernels decay by
// 2^(a·log2 e)). a_exp = exp(A_log[h]) (1 without A_log), dt_bias 0 without one; lower_bound is
// read by SAFE only.
template <int GATE> PYKDA_DEVICE float kda_log2_decay(float g, float dt_bias, float a_exp, float lower_bound) {
  if (GATE == KDA_GATE_SAFE) return lower_bound * KDA_LOG2E * kda_fast_sigmoid(a_exp * (g + dt_bias));
  if (GATE == KDA_GATE_SOFTPLUS) return -a_exp * kda_log2_softplus(g + dt_bias);
  return g * KDA_LOG2E;
}

// β of one token from what the caller passed.
template <int BETA> PYKDA_DEVICE float kda_beta(float b) {
  if (BETA == KDA_BETA_LOGIT) return kda_sigmoid(b);
  if (BETA == KDA_BETA_LOGIT2) return 2.f * kda_sigmoid(b);
  return b;
}
