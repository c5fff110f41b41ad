// The per-token math of Kimi Delta Attention shared by the prefill and decode kernels:
// L2 normalisation of q and k, the gate, and beta. One place for these semantics.
#pragma once
#include "common.cuh"

constexpr float KDA_L2_EPS = 1e-6f;

PYKDA_DEVICE float kda_sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// 1 / sqrt(Σx² + eps): multiply a row of q or k by this to L2-normalise it.
PYKDA_DEVICE float kda_l2_inv_norm(float sum_sq) { return rsqrtf(sum_sq + KDA_L2_EPS); }

// Log-decay of one key dimension: a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias)), in (lower_bound, 0).
// `a_exp` is exp(A_log[h]), computed once per head.
PYKDA_DEVICE float kda_gate(float g, float a_exp, float dt_bias, float lower_bound) {
  return lower_bound * kda_sigmoid(a_exp * (g + dt_bias));
}

// β = sigmoid(beta logit).
PYKDA_DEVICE float kda_beta(float beta_logit) { return kda_sigmoid(beta_logit); }
