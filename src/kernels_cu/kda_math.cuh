// The per-token math of Kimi Delta Attention shared by the prefill (kda_prepare) and decode
// (kda_decode) kernels: L2 normalisation of q and k, the gate, and beta. One place for these
// semantics, so prefill and decode compute exactly the same thing.
#pragma once
#include "common.cuh"

constexpr float KDA_L2_EPS = 1e-6f;
constexpr float KDA_LOG2E = 1.4426950408889634f;

// Logistic function with the accurate expf: sigmoid(-inf) = 0, sigmoid(+inf) = 1, NaN stays NaN.
PYKDA_DEVICE float kda_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// 1 / sqrt(Σx² + eps): multiply a row of q or k by this to L2-normalise it.
PYKDA_DEVICE float kda_l2_inv_norm(float sum_sq) { return rsqrtf(sum_sq + KDA_L2_EPS); }
PYKDA_DEVICE float kda_inv_norm(float sum_sq) { return kda_l2_inv_norm(sum_sq); }

// Log-decay (natural log) of one key dimension:
// a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias)), in (lower_bound, 0).
// Argument order: g, dt_bias, a_exp = exp(A_log[h]) (computed once per head), lower_bound.
PYKDA_DEVICE float kda_gate(float g, float dt_bias, float a_exp, float lower_bound) {
  return lower_bound * kda_sigmoid(a_exp * (g + dt_bias));
}
// The same in base 2 (a · log2 e), what the chunked form accumulates.
PYKDA_DEVICE float kda_gate_log2(float g, float dt_bias, float a_exp, float lower_bound) {
  return kda_gate(g, dt_bias, a_exp, lower_bound) * KDA_LOG2E;
}

// β = sigmoid(beta logit).
PYKDA_DEVICE float kda_beta(float beta_logit) { return kda_sigmoid(beta_logit); }
