"""Warp-level emulation of transposed.patch's fragment index math (NumPy, fp64): ldmatrix x4 (and
.trans) from the TMA-swizzled tile (`tile_offset`), mma.m16n8k16 row.col fragments, movmatrix.trans,
each as PTX lays out its registers. For every warp of a tile it checks Sᵀ = K·qᵀ (rows mt·16 + g
(+8), heads 2t, 2t + 1), and Oᵀ = Vᵀ·Pᵀ at the coordinates the merge buffer is written from.
    python docs/studies/decode_short/frag_emu.py D BLOCK_N WARPS     (e.g. 128 64 4)
"""
import sys

import numpy as np

rng = np.random.default_rng(0)
D, BLOCK_N, WARPS = map(int, sys.argv[1:4])
ROWS_PER_WARP = BLOCK_N // WARPS
MT = ROWS_PER_WARP // 16
SUBTILE_BYTES = BLOCK_N * 128
lanes = np.arange(32)
g, t = lanes // 4, lanes % 4


def tile_offset(row, chunk):
    return (chunk // 8) * SUBTILE_BYTES + row * 128 + (((chunk % 8) ^ (row & 7)) << 4)


def store_tile(M):   # M [BLOCK_N][D] -> byte-addressed dict: addr of a 16-byte chunk -> 8 values
    mem = {}
    for r in range(BLOCK_N):
        for c in range(D // 8):
            mem[tile_offset(r, c)] = M[r, c * 8:(c + 1) * 8]
    return mem


def ldmatrix_x4(mem, addr_of_lane, trans=False):
    """addr_of_lane[l]: the row address lane l gives (lanes 8i..8i+7: matrix i's rows 0..7).
    Returns regs[4][32][2]: reg i of lane l holds (l/4, 2(l%4)..+1) of matrix i (or of its transpose)."""
    regs = np.zeros((4, 32, 2))
    for i in range(4):
        mat = np.stack([mem[addr_of_lane[8 * i + r]] for r in range(8)])   # [8 rows][8 cols]
        if trans:
            mat = mat.T
        for l in range(32):
            regs[i, l] = mat[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
    return regs


def mma(dacc, a, b):
    """dacc [32][4], a [4][32][2], b [2][32][2] -> D += A·B (m16n8k16)."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        G, T = l // 4, l % 4
        A[G, 2 * T:2 * T + 2] = a[0, l]; A[G + 8, 2 * T:2 * T + 2] = a[1, l]
        A[G, 2 * T + 8:2 * T + 10] = a[2, l]; A[G + 8, 2 * T + 8:2 * T + 10] = a[3, l]
        B[2 * T:2 * T + 2, G] = b[0, l]; B[2 * T + 8:2 * T + 10, G] = b[1, l]
    C = A @ B
    for l in range(32):
        G, T = l // 4, l % 4
        dacc[l, 0:2] += C[G, 2 * T:2 * T + 2]; dacc[l, 2:4] += C[G + 8, 2 * T:2 * T + 2]


def movmatrix_trans(reg):   # reg [32][2]: lane l holds (l/4, 2(l%4)..) of M -> the same of Mᵀ
    M = np.zeros((8, 8))
    for l in range(32):
        M[l // 4, 2 * (l % 4):2 * (l % 4) + 2] = reg[l]
    out = np.zeros((32, 2))
    for l in range(32):
        out[l] = M.T[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
    return out


heads = 5   # heads_here <= 8
K = rng.standard_normal((BLOCK_N, D)); V = rng.standard_normal((BLOCK_N, D)); q = rng.standard_normal((heads, D))
kmem, vmem = store_tile(K), store_tile(V)
worst = 0.0
for warp in range(WARPS):
    warp_row = warp * ROWS_PER_WARP
    # q as B: qa[kk][0] = head g's cols kk*16 + 2t.., qa[kk][2] = +8 (zero past heads)
    qb = np.zeros((D // 16, 2, 32, 2))
    for kk in range(D // 16):
        for l in range(32):
            if g[l] < heads:
                qb[kk, 0, l] = q[g[l], kk * 16 + 2 * t[l]:kk * 16 + 2 * t[l] + 2]
                qb[kk, 1, l] = q[g[l], kk * 16 + 2 * t[l] + 8:kk * 16 + 2 * t[l] + 10]
    sc = np.zeros((MT, 32, 4))
    for kk in range(D // 16):
        for mt in range(MT):
            m = lanes // 8
            row = warp_row + mt * 16 + (m & 1) * 8 + (lanes & 7)
            addr = [tile_offset(row[l], kk * 2 + (m[l] >> 1)) for l in range(32)]
            mma(sc[mt], ldmatrix_x4(kmem, addr), qb[kk])
    # check: sc[mt][l][e] = K[row] . q[head], row = warp_row + mt*16 + g + 8(e>>1), head = 2t + (e&1)
    S = K @ np.vstack([q, np.zeros((8 - heads, D))]).T   # [rows][8 heads]
    for mt in range(MT):
        for l in range(32):
            for e in range(4):
                r = warp_row + mt * 16 + g[l] + 8 * (e >> 1); h = 2 * t[l] + (e & 1)
                worst = max(worst, abs(sc[mt, l, e] - S[r, h]))
    # P: any values; the B operand through movmatrix; Oᵀ += Vᵀ Pᵀ
    P = rng.standard_normal((ROWS_PER_WARP, 8))
    o = np.zeros((D // 16, 32, 4))
    for mt in range(MT):
        blk = np.zeros((2, 32, 2))   # pack2(sc[mt][0], sc[mt][1]) and (2, 3): rows g (+8), heads 2t..
        for l in range(32):
            blk[0, l] = P[mt * 16 + g[l], 2 * t[l]:2 * t[l] + 2]
            blk[1, l] = P[mt * 16 + 8 + g[l], 2 * t[l]:2 * t[l] + 2]
        pb = np.stack([movmatrix_trans(blk[0]), movmatrix_trans(blk[1])])
        for md in range(D // 16):
            m = lanes // 8
            row = warp_row + mt * 16 + (m >> 1) * 8 + (lanes & 7)
            addr = [tile_offset(row[l], md * 2 + (m[l] & 1)) for l in range(32)]
            mma(o[md], ldmatrix_x4(vmem, addr, trans=True), pb)
    O = V[warp_row:warp_row + ROWS_PER_WARP].T @ P   # [D][8 heads]
    # red coordinates: o[md][l][h] -> (head 2t+h, col md*16+g), o[md][l][2+h] -> (head 2t+h, col md*16+g+8)
    for md in range(D // 16):
        for l in range(32):
            for h in range(2):
                worst = max(worst, abs(o[md, l, h] - O[md * 16 + g[l], 2 * t[l] + h]))
                worst = max(worst, abs(o[md, l, 2 + h] - O[md * 16 + g[l] + 8, 2 * t[l] + h]))
print("max |emulated - direct|:", worst)
assert worst < 1e-9
