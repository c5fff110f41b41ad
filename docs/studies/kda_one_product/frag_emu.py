"""Warp-level emulation (NumPy, fp64) of kda_recurrence's fold_kdb: ldmatrix x4 of Ab from the
record's core matrices, ldmatrix x4.trans of kd from its 128-byte-swizzled tiles, mma.m16n8k16,
stmatrix x4 of −Ab·kd back over kd, in the kernel's order (so an in-place overwrite before a read
shows). Checks the record's KD slot then holds −Ab·kd in kd's own layout, and the other slots
untouched.    python docs/studies/kda_one_product/frag_emu.py K C    (e.g. 128 16)
"""
import sys

import numpy as np

K, C = map(int, sys.argv[1:3])
rng = np.random.default_rng(0)
TILE = C * 128            # KdaRecord<K, C>: bytes of a 64-column tile of a [C][K] matrix
QD, KD, QK_STRIDE = 0, TILE, 2 * TILE
KR = 2 * C * K * 2
AB = KR + C * K * 2


def tile_off(row, chunk, stride):   # kda_tile_off
    return (chunk >> 3) * stride + row * 128 + (((chunk & 7) ^ (row & 7)) << 4)


def core_off(row, chunk):           # kda_core_off<C>
    return (row >> 3) * (C // 8) * 128 + chunk * 128 + (row & 7) * 16


def store(mem, base, M, off):       # M [rows][cols]: 16-byte chunks (8 values) at base + off(row, chunk)
    for r in range(M.shape[0]):
        for c in range(M.shape[1] // 8):
            mem[base + off(r, c)] = M[r, 8 * c:8 * c + 8].copy()


def load(mem, base, rows, cols, off):
    return np.stack([np.concatenate([mem[base + off(r, c)] for c in range(cols // 8)]) for r in range(rows)])


def ldmatrix_x4(mem, addr, trans=False):   # addr[l]: lane l's row address; regs[i][l] = 2 values
    regs = np.zeros((4, 32, 2))
    for i in range(4):
        mat = np.stack([mem[addr[8 * i + r]] for r in range(8)])
        mat = mat.T if trans else mat
        for l in range(32):
            regs[i, l] = mat[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
    return regs


def stmatrix_x4(mem, addr, regs):
    for i in range(4):
        mat = np.zeros((8, 8))
        for l in range(32):
            mat[l // 4, 2 * (l % 4):2 * (l % 4) + 2] = regs[i, l]
        for r in range(8):
            mem[addr[8 * i + r]] = mat[r].copy()


def mma(acc, a, b):   # acc [32][4] += A (a [4][32][2]) · B (b [2][32][2]), m16n8k16
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[0, l], a[1, l]
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[2, l], a[3, l]
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b[0, l], b[1, l]
    D = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        acc[l, 0:2] += D[g, 2 * t:2 * t + 2]
        acc[l, 2:4] += D[g + 8, 2 * t:2 * t + 2]


def fold_kdb(mem):   # the kernel's fold_kdb, lane by lane
    lanes = np.arange(32)
    m, row = lanes // 8, 8 * ((lanes // 8) & 1) + (lanes & 7)
    ab = {(mi, kk): ldmatrix_x4(mem, [AB + core_off(16 * mi + row[l], 2 * kk + (m[l] >> 1)) for l in lanes])
          for mi in range(C // 16) for kk in range(mi + 1)}
    batch = K // 16 if C == 16 else 1   # FOLD_BATCH: key-dim pairs read before any is written
    for p0 in range(0, K // 16, batch):
        kb = {p: [ldmatrix_x4(mem, [KD + tile_off(16 * kk + row[l], 2 * p + (m[l] >> 1), QK_STRIDE) for l in lanes],
                              trans=True) for kk in range(C // 16)] for p in range(p0, p0 + batch)}
        for p in range(p0, p0 + batch):
            for mi in range(C // 16):
                acc = [np.zeros((32, 4)), np.zeros((32, 4))]
                for kk in range(mi + 1):
                    mma(acc[0], ab[mi, kk], kb[p][kk][[0, 1]])
                    mma(acc[1], ab[mi, kk], kb[p][kk][[2, 3]])
                out = np.stack([-acc[0][:, 0:2], -acc[0][:, 2:4], -acc[1][:, 0:2], -acc[1][:, 2:4]])
                stmatrix_x4(mem, [KD + tile_off(16 * mi + row[l], 2 * p + (m[l] >> 1), QK_STRIDE) for l in lanes], out)


kd, qd = rng.standard_normal((C, K)), rng.standard_normal((C, K))
Ab = np.tril(rng.standard_normal((C, C)))
mem = {}
store(mem, QD, qd, lambda r, c: tile_off(r, c, QK_STRIDE))
store(mem, KD, kd, lambda r, c: tile_off(r, c, QK_STRIDE))
store(mem, AB, Ab, core_off)
fold_kdb(mem)
err = np.abs(load(mem, KD, C, K, lambda r, c: tile_off(r, c, QK_STRIDE)) + Ab @ kd).max()
qd_kept = np.array_equal(load(mem, QD, C, K, lambda r, c: tile_off(r, c, QK_STRIDE)), qd)
ab_kept = np.array_equal(load(mem, AB, C, C, core_off), Ab)
print(f"K {K} C {C}: max |kdb - (-Ab·kd)| {err:.1e}, qd untouched {qd_kept}, Ab untouched {ab_kept}")
sys.exit(0 if err < 1e-12 and qd_kept and ab_kept else 1)
