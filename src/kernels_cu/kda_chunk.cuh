// KDA prefill plumbing shared by kda_prepare and kda_recurrence: sequence bounds, the
// per-(chunk, head) workspace record both kernels agree on, and the 1-D bulk copy.
#pragma once
#include "common.cuh"
#include "ptx.cuh"

// Per (chunk, head) record that kda_prepare writes and kda_recurrence streams in with one bulk
// copy, laid out for both of the recurrence's tensor-core paths (ldmatrix + mma.sync, and wgmma
// reading its B operands straight from the record):
// - [C][K] matrices of 16-bit values in tiles of 64 columns (128-byte rows, C rows a tile), each
//   row's 16-byte chunks XOR-swizzled by row (kda_tile_off): wgmma's 128-byte swizzle, which
//   also keeps ldmatrix of 8 rows on 8 bank groups. QD and KD alternate tile by tile (QD's tile
//   t, then KD's: one wgmma B operand of 2C rows); KR's tiles follow.
// - [C][C] matrices in 8 x 8 core matrices of 16-byte rows (kda_core_off): wgmma's layout
//   without swizzle.
template <int K, int C> struct KdaRecord {
  static constexpr int TILE = C * 128;             // bytes of one 64-column tile of a [C][K] matrix
  static constexpr int QD = 0;                     // fp16 [C][K]  scale·q̂·2^G   (tile stride 2·TILE)
  static constexpr int KD = TILE;                  // fp16 [C][K]  k̂·2^G         (tile stride 2·TILE)
  static constexpr int QK_STRIDE = 2 * TILE;
  static constexpr int KR = 2 * C * K * 2;         // fp16 [C][K]  k̂·2^(G_C - G) (tile stride TILE)
  static constexpr int AB = KR + C * K * 2;        // fp16 [C][C]  (I + L)^-1 · diag(β)
  static constexpr int MQK = AB + C * C * 2;       // fp16 [C][C]  lower_incl(qd · kiᵀ)
  static constexpr int GAMMA = MQK + C * C * 2;    // fp32 [K]     2^G_C
  static constexpr int BYTES = GAMMA + K * 4;      // a multiple of 16
  static_assert(BYTES % 16 == 0 && K % 64 == 0 && TILE % 1024 == 0, "record layout");
};

// Byte offset of 16-byte chunk `chunk` (columns 8·chunk..) of row `row` of a [rows][K] 16-bit
// matrix stored as 64-column tiles `tile_stride` bytes apart, 128-byte rows XOR-swizzled by row
// (the tiles 1024-byte aligned: wgmma's 128-byte swizzle).
PYKDA_DEVICE uint32_t kda_tile_off(int row, int chunk, int tile_stride) {
  return uint32_t((chunk >> 3) * tile_stride + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
// Byte offset of 16-byte chunk `chunk` (columns 8·chunk..) of row `row` of a [C][C] 16-bit
// matrix in 8 x 8 core matrices: 128 bytes each, K-adjacent ones 128 bytes apart, row groups
// of 8 C / 8 · 128 bytes apart.
template <int C> PYKDA_DEVICE uint32_t kda_core_off(int row, int chunk) {
  return uint32_t((row >> 3) * (C / 8) * 128 + chunk * 128 + (row & 7) * 16);
}

// Token range [begin, end) of sequence n. Fixed length (cu == nullptr): batch row n, [0, T).
// Varlen: row 0, [cu[n], cu[n+1]) clamped into [0, T] and to a non-negative length, so a
// malformed cu_seqlens can never send a kernel out of bounds (its results are then undefined).
PYKDA_DEVICE long long kda_cu_at(const void* cu, int cu_is64, int i) {
  return cu_is64 ? static_cast<const long long*>(cu)[i] : (long long)static_cast<const int*>(cu)[i];
}
PYKDA_DEVICE long long kda_seq_begin(const void* cu, int cu_is64, int n, int T) {   // varlen
  const long long b = kda_cu_at(cu, cu_is64, n);
  return b < 0 ? 0 : (b > T ? T : b);
}
PYKDA_DEVICE void kda_seq_bounds(const void* cu, int cu_is64, int n, int T, int& begin, int& end) {
  if (cu == nullptr) {
    begin = 0;
    end = T;
    return;
  }
  const long long b = kda_seq_begin(cu, cu_is64, n, T);
  long long e = kda_cu_at(cu, cu_is64, n + 1);
  e = e < b ? b : (e > T ? T : e);
  begin = int(b);
  end = int(e);
}


// ---- where a sequence's chunks and segments live ----
// No prefix sum over the batch is needed (no extra kernel, no host synchronisation): sequence n's
// chunk records are the slots from base(n) = n·ceil(T / C) (fixed length) or floor(begin_n / C) + n
// (varlen). Varlen ranges never overlap, since base(n+1) − base(n) = floor(begin_{n+1} / C) −
// floor(begin_n / C) + 1 >= ceil(len_n / C), and end below ceil(T / C) + N (the grid's bound).
struct KdaSeq {
  int n, b;            // sequence, and its batch row (0 with varlen)
  int begin, end;      // its tokens [begin, end)
  int chunks;          // ceil((end − begin) / C)
  long long base;      // its first chunk slot
};
PYKDA_DEVICE long long kda_chunk_base(const void* cu, int cu_is64, int n, int T, int C) {
  if (cu == nullptr) return (long long)n * ((T + C - 1) / C);
  return kda_seq_begin(cu, cu_is64, n, T) / C + n;
}
PYKDA_DEVICE KdaSeq kda_sequence(const void* cu, int cu_is64, int n, int T, int C) {
  KdaSeq s;
  s.n = n;
  s.b = cu == nullptr ? n : 0;
  kda_seq_bounds(cu, cu_is64, n, T, s.begin, s.end);
  s.chunks = (s.end - s.begin + C - 1) / C;
  s.base = kda_chunk_base(cu, cu_is64, n, T, C);
  return s;
}
// The last n in [0, N) with key(n) <= z, for key non-decreasing in n (with a malformed
// cu_seqlens: some n in range).
template <typename Key> PYKDA_DEVICE int kda_last_at_most(int N, long long z, Key key) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (key(mid) <= z) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}
// The sequence owning chunk slot x (varlen; fixed length: x / ceil(T / C)).
PYKDA_DEVICE int kda_sequence_of_slot(long long x, const void* cu, int cu_is64, int N, int T, int C) {
  if (cu == nullptr) return int(x / ((T + C - 1) / C));
  return kda_last_at_most(N, x, [&](int m) { return kda_chunk_base(cu, cu_is64, m, T, C); });
}

// Segments of `seg` chunks (kda_recurrence, kda_segment_scan). A sequence of more than
// `split_above` chunks has nseg_n = ceil(chunks_n / seg) of them, a shorter one a single one; each
// sequence has a map slot for every segment but its last. Fixed length (split_above 0): every
// sequence has per = max(1, ceil(ceil(T / C) / seg)) segments, numbered from n·per, and map slots
// from n·(per − 1). Varlen: segments numbered from sbase(n) = floor(base(n) / seg) + n and map slots
// from mbase(n) = floor(base(n) / seg); these grow by at least nseg_n and nseg_n − 1 from one
// sequence to the next (as base does by chunks_n) and stay below ceil((ceil(T / C) + N) / seg) + N
// and ceil((ceil(T / C) + N) / seg). A rank's slice (kda_recurrence's RANK, fixed length) has a
// map slot for every segment, numbered as the segments.
struct KdaSegments {
  int nseg;             // the sequence's segments
  long long first;      // its first segment
  long long first_map;  // its first map slot
};
PYKDA_DEVICE int kda_segments_per_sequence(int seg, int T, int C) {   // fixed length
  return max(1, ((T + C - 1) / C + seg - 1) / seg);
}
PYKDA_DEVICE KdaSegments kda_segments(const KdaSeq& s, int seg, int split_above, bool varlen, int T, int C) {
  const int per = kda_segments_per_sequence(seg, T, C);
  KdaSegments r;
  r.nseg = s.chunks > split_above ? max(1, (s.chunks + seg - 1) / seg) : 1;
  r.first = varlen ? s.base / seg + s.n : (long long)s.n * per;
  r.first_map = varlen ? s.base / seg : (long long)s.n * (per - 1);
  return r;
}
struct KdaSegment {
  KdaSeq s;
  KdaSegments all;      // the sequence's segments
  int j;                // this one (< 0: the index is past the last one)
};
// Segment number idx (in_maps: map slot number idx); seg = 0: sequence idx, whole.
PYKDA_DEVICE KdaSegment kda_segment_of(long long idx, bool in_maps, int seg, int split_above, const void* cu,
                                       int cu_is64, int N, int T, int C) {
  KdaSegment g;
  g.j = -1;
  if (seg == 0) {
    g.s = kda_sequence(cu, cu_is64, int(idx), T, C);
    g.all = KdaSegments{1, idx, 0};
    g.j = 0;
    return g;
  }
  const int sub = in_maps ? 1 : 0, per = kda_segments_per_sequence(seg, T, C);
  int n;
  if (cu == nullptr) {
    n = per - sub > 0 ? int(idx / (per - sub)) : N;
  } else {
    n = kda_last_at_most(N, idx, [&](int m) { return kda_chunk_base(cu, cu_is64, m, T, C) / seg + (in_maps ? 0 : m); });
  }
  if (n >= N) return g;
  g.s = kda_sequence(cu, cu_is64, n, T, C);
  g.all = kda_segments(g.s, seg, split_above, cu != nullptr, T, C);
  const long long j = idx - (in_maps ? g.all.first_map : g.all.first);
  if (j >= 0 && j < g.all.nseg - sub) g.j = int(j);
  return g;
}
// The scan's candidate z of `candidates` (its grid's): a sequence that may have 3 segments or
// more, i.e. more than long_ = max(split_above, 2·seg) chunks. Fixed length: sequence z. Varlen:
// sequence z too when there are candidates for all N; else (the host's bound, (ceil(T / C) + N) /
// (long_ + 1) + 1, is below N) the one with floor(base(n) / (long_ + 1)) = z, an index below the
// bound that no two such sequences share (base grows by more than long_ past each). Others: nseg = 0.
PYKDA_DEVICE KdaSegments kda_scan_candidate(long long z, long long candidates, int seg, int split_above,
                                            const void* cu, int cu_is64, int N, int T, int C) {
  const KdaSegments none{0, 0, 0};
  if (cu == nullptr || N <= candidates) {
    return z < N ? kda_segments(kda_sequence(cu, cu_is64, int(z), T, C), seg, split_above, cu != nullptr, T, C)
                 : none;
  }
  const long long span = max(split_above, 2 * seg) + 1;
  const int n = kda_last_at_most(N, z, [&](int m) { return kda_chunk_base(cu, cu_is64, m, T, C) / span; });
  const KdaSeq s = kda_sequence(cu, cu_is64, n, T, C);
  return s.base / span == z ? kda_segments(s, seg, split_above, true, T, C) : none;
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
