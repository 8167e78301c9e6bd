// SPDX-License-Identifier: Apache-2.0
// Row-invariant MoE experts on CPUs: each (token, expert) slot's two projections, one expert's slots at a time.
// Built and loaded by specmoe/kernels/slot_experts.py (through inductor's C++ code cache: its compiler and flags,
// -ffp-contract=off among them, so every multiply and every add is rounded on its own).
//
// Weights are input-major (gate_up [E, H, 2I], down [E, I, H]: a row of outputs per input element), so an output
// element is a plain running sum over the inputs in order, y[n] = (((w[0][n] x[0]) + w[1][n] x[1]) + ...), computed
// in vector lanes over n: no horizontal reduction, and the same operations for an output whichever block, vector
// width or number of slots computes it. Each weight vector is loaded (in bf16: converted) once for a block of up to
// BLOCK slots of its expert, the union's weights read once per pass.
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int BLOCK = 4;  // slots sharing each loaded weight vector
constexpr int VECS = 2;   // output vectors of eight per block (16 outputs: vec16)

typedef float v8 __attribute__((vector_size(32)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

inline float bf16_value(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// float -> bfloat16 -> float, round to nearest even as torch rounds (NaN stays a quiet NaN)
inline float bf16_round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        u = (u | 0x00400000u) & 0xffff0000u;
    } else {
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    }
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline float value(const float* p, int64_t i) { return p[i]; }
inline float value(const uint16_t* p, int64_t i) { return bf16_value(p[i]); }

inline v8 vec(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline v8 vec(const uint16_t* p) {
    u16x8 h;
    std::memcpy(&h, p, sizeof h);
    u32x8 u = __builtin_convertvector(h, u32x8) << 16;
    v8 v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

// The 16 weights at p as two vectors of eight lanes. float: in order. bfloat16: widened by interleaving with
// zeros (one unpack instruction per vector on x86), lanes holding weights {0-3, 8-11} and {4-7, 12-15}: the
// running sums of a block of 16 outputs are kept in that order (LANE_OF) and put back in order at the end
inline void vec16(const float* p, v8* out) {
    out[0] = vec(p);
    out[1] = vec(p + 8);
}

inline void vec16(const uint16_t* p, v8* out) {
    u16x16 h;
    std::memcpy(&h, p, sizeof h);
    const u16x16 z = {};
    const u16x16 lo = __builtin_shufflevector(z, h, 0, 16, 0, 17, 0, 18, 0, 19, 0, 24, 0, 25, 0, 26, 0, 27);
    const u16x16 hi = __builtin_shufflevector(z, h, 0, 20, 0, 21, 0, 22, 0, 23, 0, 28, 0, 29, 0, 30, 0, 31);
    std::memcpy(&out[0], &lo, sizeof lo);
    std::memcpy(&out[1], &hi, sizeof hi);
}

// bfloat16: the output each position of a block of 16 running sums holds
constexpr int LANE_OF[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

// ys[b][n] += sum over k in [k0, k0 + KU) in order of w[k][n] * xs[b][k], n in [0, N), for NB slots: KU rows of
// weights streamed once for the NB slots, each output's running sum kept in its slot's row of ys (in L1)
template <int NB, int KU, typename W>
inline void rows(const W* __restrict w, int64_t N, int64_t k0, const float* const* xs, float* const* ys) {
    constexpr int64_t STEP = 8 * VECS;
    const int64_t n_vec = N - N % STEP;
    float xk[NB][KU];
    for (int b = 0; b < NB; ++b)
        for (int u = 0; u < KU; ++u) xk[b][u] = xs[b][k0 + u];
    for (int64_t n = 0; n < n_vec; n += STEP) {
        v8 wv[KU][VECS];
        for (int u = 0; u < KU; ++u) vec16(w + (k0 + u) * N + n, wv[u]);
        // the rows two groups ahead (prefetching never faults, past the end included): the weights arrive while
        // these are multiplied (without: a 6-token pass's experts 1.18 -> 0.86 ms per layer in float32, 0.90 ->
        // 0.44 in bf16, 2-core Zen 3). Into every cache level (locality 3, prefetcht0): the non-temporal hint
        // (locality 0, prefetchnta) made them 4.6x slower on a Sapphire Rapids than this, 1.6x slower than no
        // prefetch at all (the demo target's 4 experts of a layer for one token, float32, one thread, weights from
        // memory: 988 us nta, 222 us none, 215 us t0; bf16 354 / 162 / 121 us)
        for (int u = 0; u < KU; ++u) __builtin_prefetch(w + (k0 + 2 * KU + u) * N + n, 0, 3);
        for (int b = 0; b < NB; ++b) {
            for (int v = 0; v < VECS; ++v) {
                v8 acc = vec(ys[b] + n + 8 * v);
                for (int u = 0; u < KU; ++u) acc = acc + wv[u][v] * xk[b][u];
                std::memcpy(ys[b] + n + 8 * v, &acc, sizeof acc);
            }
        }
    }
    for (int64_t n = n_vec; n < N; ++n) {  // the same running sums, one output at a time
        for (int b = 0; b < NB; ++b) {
            float acc = ys[b][n];
            for (int u = 0; u < KU; ++u) acc = acc + value(w, (k0 + u) * N + n) * xk[b][u];
            ys[b][n] = acc;
        }
    }
}

template <int NB, typename W>
inline void accumulate(const W* w, int64_t K, int64_t N, const float* const* xs, float* const* ys) {
    constexpr int KU = 4;
    int64_t k = 0;
    for (; k + KU <= K; k += KU) rows<NB, KU>(w, N, k, xs, ys);
    for (; k < K; ++k) rows<NB, 1>(w, N, k, xs, ys);
}

// out[s, :N] = x[s, :K] . w[K, N] (+ bias), rounded to the weights' dtype, for the n slots s in `slots` (of one
// expert), in blocks of up to BLOCK slots
template <typename W>
void project(const W* w, const W* bias, int64_t K, int64_t N, const float* x, const int64_t* slots, int64_t n,
             float* out, bool round) {
    const float* xs[BLOCK];
    float* ys[BLOCK];
    for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
        const int nb = static_cast<int>(n - j0 < BLOCK ? n - j0 : BLOCK);
        for (int i = 0; i < nb; ++i) {
            xs[i] = x + slots[j0 + i] * K;
            ys[i] = out + slots[j0 + i] * N;
            for (int64_t q = 0; q < N; ++q) ys[i][q] = 0.0f;
        }
        switch (nb) {
            case 4: accumulate<4>(w, K, N, xs, ys); break;
            case 3: accumulate<3>(w, K, N, xs, ys); break;
            case 2: accumulate<2>(w, K, N, xs, ys); break;
            default: accumulate<1>(w, K, N, xs, ys); break;
        }
        for (int i = 0; i < nb; ++i) {
            if constexpr (sizeof(W) != sizeof(float)) {  // the running sums back in output order
                float blk[16];
                for (int64_t q = 0; q + 16 <= N - N % (8 * VECS); q += 16) {
                    for (int l = 0; l < 16; ++l) blk[LANE_OF[l]] = ys[i][q + l];
                    std::memcpy(ys[i] + q, blk, sizeof blk);
                }
            }
            for (int64_t q = 0; q < N; ++q) {
                float v = bias != nullptr ? ys[i][q] + value(bias, q) : ys[i][q];
                ys[i][q] = round ? bf16_round(v) : v;
            }
        }
    }
}

inline void activate(const float* hs, float* as, int64_t I, bool interleaved, bool swiglu_oai, float alpha,
                     float limit, bool round) {
    for (int64_t i = 0; i < I; ++i) {
        float gate = interleaved ? hs[2 * i] : hs[i];
        float up = interleaved ? hs[2 * i + 1] : hs[I + i];
        float v;
        if (swiglu_oai) {
            gate = gate > limit ? limit : gate;
            up = up > limit ? limit : (up < -limit ? -limit : up);
            v = (up + 1.0f) * (gate * (1.0f / (1.0f + std::exp(-(gate * alpha)))));
        } else {
            v = gate / (1.0f + std::exp(-gate)) * up;
        }
        as[i] = round ? bf16_round(v) : v;
    }
}

// the slots of [g0, g1) whose input row differs from the previous slot's, bit for bit (a one-token pass run as
// two rows, a token repeated in a tree): the others take the result of the slot before them, which the same
// operations would give them
inline int64_t distinct(const float* x, int64_t K, int64_t g0, int64_t g1, int64_t* slots) {
    int64_t n = 0;
    for (int64_t s = g0; s < g1; ++s)
        if (s == g0 || std::memcmp(x + s * K, x + (s - 1) * K, K * sizeof(float)) != 0) slots[n++] = s;
    return n;
}

// the rows of [g0, g1) left out by distinct(): a copy of the row before them
inline void fill_repeats(float* y, int64_t N, int64_t g0, int64_t g1, const int64_t* slots, int64_t n) {
    for (int64_t s = g0 + 1, j = 0; s < g1; ++s) {
        if (j + 1 < n && slots[j + 1] == s) {
            ++j;
        } else if (slots[j] != s) {
            std::memcpy(y + s * N, y + slots[j] * N, N * sizeof(float));
        }
    }
}

template <typename W>
void slot_experts(const float* x, const int64_t* e, int64_t S, const W* gu, const W* b_gu, const W* dn,
                  const W* b_d, int64_t H, int64_t I, int interleaved, int swiglu_oai, float alpha, float limit,
                  float* y, float* h, float* a, int64_t* slots) {
    const bool round = sizeof(W) != sizeof(float);
    int64_t g0 = 0;
    while (g0 < S) {
        const int64_t ex = e[g0];
        int64_t g1 = g0 + 1;
        while (g1 < S && e[g1] == ex) ++g1;
        const int64_t n = distinct(x, H, g0, g1, slots);
        project(gu + ex * H * 2 * I, b_gu != nullptr ? b_gu + ex * 2 * I : nullptr, H, 2 * I, x, slots, n, h,
                round);
        for (int64_t j = 0; j < n; ++j)
            activate(h + slots[j] * 2 * I, a + slots[j] * I, I, interleaved, swiglu_oai, alpha, limit, round);
        project(dn + ex * I * H, b_d != nullptr ? b_d + ex * H : nullptr, I, H, a, slots, n, y, round);
        fill_repeats(y, H, g0, g1, slots, n);
        g0 = g1;
    }
}

}  // namespace

extern "C" {

// x [S, H] float32 (each slot's token, in the weights' precision), e [S] int64 ascending,
// gate_up [E, H, 2I] (interleaved: gate, up, gate, ... else gate outputs first), gate_up_bias [E, 2I] or null,
// down [E, I, H], down_bias [E, H] or null: float32 where bf16 == 0, bfloat16 bits otherwise;
// y [S, H] float32 out; scratch h [S, 2I], a [S, I], slots [S] int64
void specmoe_slot_experts(const float* x, const int64_t* e, int64_t S, const void* gu, const void* b_gu,
                          const void* dn, const void* b_d, int64_t H, int64_t I, int bf16, int interleaved,
                          int swiglu_oai, float alpha, float limit, float* y, float* h, float* a,
                          int64_t* slots) {
    if (bf16) {
        slot_experts(x, e, S, static_cast<const uint16_t*>(gu), static_cast<const uint16_t*>(b_gu),
                     static_cast<const uint16_t*>(dn), static_cast<const uint16_t*>(b_d), H, I, interleaved,
                     swiglu_oai, alpha, limit, y, h, a, slots);
    } else {
        slot_experts(x, e, S, static_cast<const float*>(gu), static_cast<const float*>(b_gu),
                     static_cast<const float*>(dn), static_cast<const float*>(b_d), H, I, interleaved, swiglu_oai,
                     alpha, limit, y, h, a, slots);
    }
}

// y [M, N] = x [M, K] . w [K, N] (+ bias [N]) in float32, unrounded (w, bias float32 where bf16 == 0, bfloat16
// bits otherwise); scratch slots [M] int64
void specmoe_linear(const float* x, int64_t M, const void* w, const void* bias, int64_t K, int64_t N, int bf16,
                    float* y, int64_t* slots) {
    const int64_t n = distinct(x, K, 0, M, slots);
    if (bf16) {
        project(static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(bias), K, N, x, slots, n, y, false);
    } else {
        project(static_cast<const float*>(w), static_cast<const float*>(bias), K, N, x, slots, n, y, false);
    }
    fill_repeats(y, N, 0, M, slots, n);
}

}  // extern "C"
