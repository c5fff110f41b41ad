// KDA prefill plumbing shared by kda_prepare and kda_recurrence: sequence bounds, the
// per-(chunk, head) workspace record both kernels agree on, and the 1-D bulk copy.
#pragma once
#include "common.cuh"
#include "ptx.cuh"

// Per (chunk, head) record that kda_prepare writes and kda_recurrence streams in with one bulk
// copy. [C][K] matrices of 16-bit values have 16-byte chunks XOR-swizzled by row (kda_swz),
// so that ldmatrix of 8 rows hits 8 different bank groups.
template <int K, int C> struct KdaRecord {
  static constexpr int QD = 0;                     // bf16 [C][K]  scale·q̂·2^G
  static constexpr int KD = QD + C * K * 2;        // bf16 [C][K]  k̂·2^G
  static constexpr int KR = KD + C * K * 2;        // fp16 [C][K]  k̂·2^(G_C - G)
  static constexpr int AB = KR + C * K * 2;        // fp16 [C][C]  (I + L)^-1 · diag(β)
  static constexpr int MQK = AB + C * C * 2;       // fp16 [C][C]  lower_incl(qd · kiᵀ)
  static constexpr int GAMMA = MQK + C * C * 2;    // fp32 [K]     2^G_C
  static constexpr int BYTES = GAMMA + K * 4;      // a multiple of 16
  static_assert(BYTES % 16 == 0 && K % 64 == 0, "record layout");
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][K] 16-bit matrix.
template <int K> PYKDA_DEVICE uint32_t kda_swz(int row, int chunk) {
  return uint32_t(row * (K * 2) + ((chunk ^ (row & 7)) << 4));
}
// Byte offset of element (row, col).
template <int K> PYKDA_DEVICE uint32_t kda_swz_elem(int row, int col) {
  return kda_swz<K>(row, col >> 3) + uint32_t((col & 7) * 2);
}

// Token range [begin, end) of sequence n. Fixed length (cu == nullptr): batch row n, [0, T).
// Varlen: row 0, [cu[n], cu[n+1]) clamped into [0, T] and to a non-negative length, so a
// malformed cu_seqlens can never send a kernel out of bounds (its results are then undefined).
PYKDA_DEVICE long long kda_cu_at(const void* cu, int cu_is64, int i) {
  return cu_is64 ? static_cast<const long long*>(cu)[i] : (long long)static_cast<const int*>(cu)[i];
}
PYKDA_DEVICE void kda_seq_bounds(const void* cu, int cu_is64, int n, int T, int& begin, int& end) {
  if (cu == nullptr) {
    begin = 0;
    end = T;
    return;
  }
  long long b = kda_cu_at(cu, cu_is64, n), e = kda_cu_at(cu, cu_is64, n + 1);
  b = b < 0 ? 0 : (b > T ? T : b);
  e = e < b ? b : (e > T ? T : e);
  begin = int(b);
  end = int(e);
}


// Element offset of S[v][k] inside one [V, K] state (V-first, pykda's and FlashKDA's) or one
// [K, V] state (K-first, fla's default); V = K.
template <int K, bool VFIRST> PYKDA_DEVICE long long kda_state_offset(int v, int k) {
  return VFIRST ? (long long)v * K + k : (long long)k * K + v;
}
// Two state elements (adjacent when V-first: one 8-byte or 4-byte access), as fp32.
PYKDA_DEVICE float2 kda_state_load2(const float* s, long long e0, long long e1) {
  return e1 == e0 + 1 ? *reinterpret_cast<const float2*>(s + e0) : make_float2(s[e0], s[e1]);
}
PYKDA_DEVICE float2 kda_state_load2(const bf16_t* s, long long e0, long long e1) {
  return e1 == e0 + 1 ? unpack2(*reinterpret_cast<const uint32_t*>(s + e0), bf16_t{})
                      : make_float2(to_float(s[e0]), to_float(s[e1]));
}
PYKDA_DEVICE void kda_state_store2(float* s, long long e0, long long e1, float2 x) {
  if (e1 == e0 + 1) {
    *reinterpret_cast<float2*>(s + e0) = x;
  } else {
    s[e0] = x.x;
    s[e1] = x.y;
  }
}
PYKDA_DEVICE void kda_state_store2(bf16_t* s, long long e0, long long e1, float2 x) {
  if (e1 == e0 + 1) {
    *reinterpret_cast<uint32_t*>(s + e0) = pack2<bf16_t>(x.x, x.y);
  } else {
    s[e0] = from_float<bf16_t>(x.x);
    s[e1] = from_float<bf16_t>(x.y);
  }
}
