"""Host check of stage_dot.cu's mma GEMV algebra: mma.sync.m16n8k16.row.col emulated from the PTX
ISA's fragment layouts (16-bit A and B, f32 C/D), fed as the kernel feeds it (lane l's 16-byte
weight chunk l + 32j of a 1024-long row as B, the matching x pairs as A's rows g = l / 4, A's rows
8-15 zero), then the diagonal D[g][g] read from lane 4g + g/2 and summed: it must equal the row's
dot product. Run: python3 benchmarks/micro/mma_diag_check.py (numpy only)."""
import numpy as np


def mma(c, a_regs, b_regs):
    """D = A B + C for one warp. a_regs[lane] = 4 pairs: (A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..],
    A[g+8][2t+8..]); b_regs[lane] = 2 pairs: (B[2t..2t+1][g], B[2t+8..2t+9][g]); c[lane] = 4 floats:
    (D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]); g = lane / 4, t = lane % 4."""
    a, b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a[g, 2 * t:2 * t + 2], a[g + 8, 2 * t:2 * t + 2], a[g, 2 * t + 8:2 * t + 10], a[g + 8, 2 * t + 8:2 * t + 10] = \
            a_regs[lane]
        b[2 * t:2 * t + 2, g], b[2 * t + 8:2 * t + 10, g] = b_regs[lane]
    d = a @ b
    out = np.array(c, dtype=float)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out[lane] += [d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1]]
    return out


def diagonal_dot(row, x):
    zero = np.zeros(2)
    c = np.zeros((32, 4))
    for j in range(4):
        for half in range(2):  # the chunk's two mmas: elements 0-3, then 4-7
            a_regs, b_regs = [], []
            for lane in range(32):
                k = 8 * (lane + 32 * j) + 4 * half
                a_regs.append((x[k:k + 2], zero, x[k + 2:k + 4], zero))
                b_regs.append((row[k:k + 2], row[k + 2:k + 4]))
            c = mma(c, a_regs, b_regs)
    return sum(c[lane][(lane >> 2) & 1] for lane in range(32) if (lane & 3) == (lane >> 3))


if __name__ == "__main__":
    rng = np.random.default_rng(20261207)
    worst = 0.0
    for _ in range(20):
        row, x = rng.standard_normal(1024), rng.standard_normal(1024)
        worst = max(worst, abs(diagonal_dot(row, x) - row @ x) / np.linalg.norm(row) / np.linalg.norm(x))
    print(f"mma diagonal GEMV against the dot product, 20 random rows: worst relative error {worst:.1e}",
          "ok" if worst < 1e-12 else "WRONG")
    raise SystemExit(0 if worst < 1e-12 else 1)
