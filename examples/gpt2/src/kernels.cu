// kernels.cu: the CUDA C++ kernels of the GPT-2 training example, compiled at run time by
// cudars-rtc (NVRTC), once per precision. The matrix products (the linear layers and the attention products
// q @ k^T and att @ v) are cuBLAS calls on the Rust side; this file holds everything else.
//
// SPDX-License-Identifier: MIT OR Apache-2.0
// Licensed under either of the MIT licence or the Apache License, Version 2.0, at your option,
// like the rest of the workspace.
//
// Conventions
// -----------
// Row-major. Activations, parameters as the matmuls read them, and gradients are floatX:
// float, or bf16 (an unsigned short holding the upper half of a float) when the program is
// compiled with -DGPT2_BF16. Every kernel computes in float: loads widen with ldx(), stores
// round to nearest even with stx(). Means, reciprocal deviations, losses, layer-norm partial
// sums, AdamW's master weights and moments are float in both. B batch, T sequence length, C channels, NH heads, HS = C / NH head size,
// V vocabulary, Vp padded vocabulary (>= V, the row stride of the logits). N = B*T rows.
// 'int' is 32-bit, 'long long' 64-bit; every kernel takes exactly the parameters listed in its
// signature, in that order. No header is included (NVRTC needs none): compile with the default
// options and WITHOUT --use_fast_math (expf/logf/tanhf must be the accurate ones to match
// PyTorch at 1e-3).
//
// Every kernel loops over its work with a grid stride (elements, or rows for the block-per-row
// kernels), so ANY grid size >= 1 is correct; the grid below is the recommended one. Threads
// past the end do nothing. Sizes <= 0 make a kernel do nothing. Products of sizes are formed
// in 64 bits.
//
// blockDim.x must be a multiple of 32 between 32 and 1024 for every kernel (the reductions are
// warp shuffles with a full mask). 256 is the recommended value everywhere. blockDim.y and .z
// and gridDim.y and .z must be 1.
//
// Launch shapes (grid = gridDim.x; block = blockDim.x; smem = dynamic shared bytes):
//
//   kernel                          grid                               block  smem
//   encoder_forward                 ceil(B*T*C / 256)                  256    0
//   layernorm_forward               ceil(N / 8)  (a warp per row)      256    0
//   residual_layernorm_forward      ceil(N / 8)  (a warp per row)      256    0
//   softmax_causal_forward          ceil(BNH*T / 8)  (a warp per row)  256    0
//   softmax_causal_backward         ceil(BNH*T / 8)  (a warp per row)  256    0
//   crossentropy_forward_backward   BT  (one block per row)            256    0
//   fill_zero                       ceil(n / 256)                      256    0
//   layernorm_backward_partial      min(N, 512)  (rows grid-strided)   256    2*C*4
//   column_sum                      ceil(2*C / 256)                    256    0
//   encoder_backward_wpe            ceil(T*C / 256)                    256    0
//   encoder_backward_wte            ceil(B*T*C / 256)                  256    0
//   adamw_begin_step                1                                  32     0
//   adamw_update_dev                ceil(n / 256)                      256    0
//   gelu_forward                    ceil(n / 8 / 256)                  256    0
//
// A 1-D grid may have at most 2^31 - 1 blocks: cap the recommended grid there (the grid stride
// covers the rest). layernorm_backward_partial's 2*C*4 bytes of dynamic shared memory stay
// below the default 48 KiB limit for C <= 6144.
//
// The backward kernels use no floating-point atomics: the same inputs give the same bits, so
// a step replayed from a graph equals the eager one exactly.
//
// Accumulation (+=) versus overwrite:
//   accumulate: layernorm_backward_partial (dinp), encoder_backward_wte (dwte, after the
//               classifier's product wrote it). Zero or write them first.
//   overwrite:  everything else (softmax_causal_backward's dpreatt, crossentropy's logits,
//               gelu_forward's out, ...).
//
// Attention's layouts need no permutation kernels: the products q k^T and att v are cuBLAS
// strided batches over the heads of one sequence, reading q, k, v where the QKV projection
// left them ((B, T, 3, NH, HS): heads HS apart, rows 3C apart) and writing att v straight into
// (B, T, NH, HS); the backward writes dq, dk, dv into dqkv the same way.

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

// floatX: the storage type of activations, parameters as the matmuls read them, and gradients.
#ifdef GPT2_BF16
typedef unsigned short floatX;
__device__ __forceinline__ float ldx(floatX x) { return __uint_as_float(((unsigned)x) << 16); }
__device__ __forceinline__ floatX stx(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (floatX)0x7fc0u;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                              // round to nearest even
    return (floatX)(u >> 16);
}
#else
typedef float floatX;
__device__ __forceinline__ float ldx(floatX x) { return x; }
__device__ __forceinline__ floatX stx(float f) { return f; }
#endif

// -infinity (no math.h under NVRTC): the identity of max.
#define NEG_INF __int_as_float(0xff800000)

#define GS_LOOP(i, n)                                                                  \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);      \
         i += (long long)gridDim.x * blockDim.x)

// The warp-per-row loops: warp w of block blockIdx.x takes rows blockIdx.x * (blockDim.x / 32)
// + w, then steps by the grid's warps. Every lane of a warp has the same row, so the warp
// shuffles see the full warp.
#define WARP_ROW_LOOP(row, rows)                                                         \
    for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);  \
         row < (rows); row += (long long)gridDim.x * (blockDim.x >> 5))

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The sum of v over the block, returned to every thread. Every thread of the block must call
// it (it synchronises); it may be called again right away.
__device__ float block_sum(float v) {
    __shared__ float part[33];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // the previous call's readers are done with part[]
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < nwarps ? part[lane] : 0.0f;
        x = warp_sum(x);
        if (lane == 0) part[32] = x;
    }
    __syncthreads();
    return part[32];
}

// The maximum of v over the block, returned to every thread (same rules as block_sum).
__device__ float block_max(float v) {
    __shared__ float part[33];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < nwarps ? part[lane] : NEG_INF;
        x = warp_max(x);
        if (lane == 0) part[32] = x;
    }
    __syncthreads();
    return part[32];
}

// ------------------------------------------------------------------------------------------
// 1. encoder_forward: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
//    A token id outside [0, V) contributes nothing from wte (out = wpe row).
// ------------------------------------------------------------------------------------------
extern "C" __global__ void encoder_forward(floatX* out, const int* inp, const floatX* wte,
                                           const floatX* wpe, int B, int T, int C, int V) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    const long long n = (long long)B * T * C;
    GS_LOOP(i, n) {
        const long long bt = i / C;
        const long long c = i - bt * C;
        const long long t = bt % T;
        const int tok = inp[bt];
        const float e = tok >= 0 && tok < V ? ldx(wte[(long long)tok * C + c]) : 0.0f;
        out[i] = stx(e + ldx(wpe[t * C + c]));
    }
}

// ------------------------------------------------------------------------------------------
// 2. layernorm_forward: one WARP per row (rows grid-strided). eps = 1e-5, biased variance
//    (two passes: the mean, then the mean of squared deviations). mean[row] and rstd[row] are
//    saved (either pointer may be null to skip it).
//    residual_layernorm_forward: the same after res = a + b (written, as floatX; the norm
//    reads the stored value, which is what the backward sees): the residual connection and
//    the next layer norm in one kernel. res may alias a or b.
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ void layernorm_row(floatX* y, float* mean, float* rstd, const floatX* x,
                                              const floatX* weight, const floatX* bias,
                                              long long row, int C, int lane) {
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += ldx(x[c]);
    const float m = warp_sum(s) / (float)C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float d = ldx(x[c]) - m;
        sq += d * d;
    }
    const float var = warp_sum(sq) / (float)C;
    const float r = 1.0f / sqrtf(var + 1e-5f);
    for (int c = lane; c < C; c += 32) {
        y[c] = stx((ldx(x[c]) - m) * r * ldx(weight[c]) + ldx(bias[c]));
    }
    if (lane == 0) {
        if (mean != nullptr) mean[row] = m;
        if (rstd != nullptr) rstd[row] = r;
    }
}

extern "C" __global__ void layernorm_forward(floatX* out, float* mean, float* rstd,
                                             const floatX* inp, const floatX* weight,
                                             const floatX* bias, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(row, N) {
        layernorm_row(out + row * C, mean, rstd, inp + row * C, weight, bias, row, C, lane);
    }
}

extern "C" __global__ void residual_layernorm_forward(floatX* res, floatX* out, float* mean,
                                                      float* rstd, const floatX* a,
                                                      const floatX* b, const floatX* weight,
                                                      const floatX* bias, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(row, N) {
        floatX* x = res + row * C;
        const floatX* ar = a + row * C;
        const floatX* br = b + row * C;
        for (int c = lane; c < C; c += 32) x[c] = stx(ldx(ar[c]) + ldx(br[c]));
        __syncwarp();
        layernorm_row(out + row * C, mean, rstd, x, weight, bias, row, C, lane);
    }
}

// ------------------------------------------------------------------------------------------
// 3. softmax_causal_forward: one WARP per row (BNH*T rows); row t of block bh.
//    att[j] = softmax_j(scale * preatt[j]) over j <= t; att[j] = 0 for j > t (written, not
//    read). In place (att == preatt) is allowed: each element is read and written by one lane.
// ------------------------------------------------------------------------------------------
extern "C" __global__ void softmax_causal_forward(floatX* att, const floatX* preatt, float scale,
                                                  int BNH, int T) {
    if (BNH <= 0 || T <= 0) return;
    const long long rows = (long long)BNH * T;
    const int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(row, rows) {
        const int t = (int)(row % T);
        const floatX* x = preatt + row * T;
        floatX* y = att + row * T;
        float mx = NEG_INF;
        for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, scale * ldx(x[j]));
        mx = warp_max(mx);
        float s = 0.0f;
        for (int j = lane; j <= t; j += 32) s += expf(scale * ldx(x[j]) - mx);
        const float inv = 1.0f / warp_sum(s);
        for (int j = lane; j < T; j += 32) {
            if (j <= t) {
                y[j] = stx(expf(scale * ldx(x[j]) - mx) * inv);
            } else {
                y[j] = stx(0.0f);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// 4. softmax_causal_backward: one WARP per row. OVERWRITES dpreatt (may alias datt).
//    dpreatt[j] = scale * att[j] * (datt[j] - sum_{i<=t} att[i]*datt[i]) for j <= t, else 0
//    (the masked half is written, not read).
// ------------------------------------------------------------------------------------------
extern "C" __global__ void softmax_causal_backward(floatX* dpreatt, const floatX* datt,
                                                   const floatX* att, float scale, int BNH,
                                                   int T) {
    if (BNH <= 0 || T <= 0) return;
    const long long rows = (long long)BNH * T;
    const int lane = threadIdx.x & 31;
    WARP_ROW_LOOP(row, rows) {
        const int t = (int)(row % T);
        const floatX* a = att + row * T;
        const floatX* da = datt + row * T;
        floatX* dp = dpreatt + row * T;
        float s = 0.0f;
        for (int j = lane; j <= t; j += 32) s += ldx(a[j]) * ldx(da[j]);
        s = warp_sum(s);
        for (int j = lane; j < T; j += 32) {
            if (j <= t) {
                dp[j] = stx(scale * ldx(a[j]) * (ldx(da[j]) - s));
            } else {
                dp[j] = stx(0.0f);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// 5. crossentropy_forward_backward: one block per row (BT rows, grid-strided).
//     p = softmax(logits[r, 0..V)); losses[r] = -log p[target];
//     logits[r, j] <- (p_j - [j == target]) * dloss for j < V, 0 for V <= j < Vp (OVERWRITE).
//     A target outside [0, V) (e.g. PyTorch's ignore_index -100) is ignored: losses[r] = 0
//     and the whole gradient row is 0 (dloss is the caller's: 1/BT for the mean over all rows).
// ------------------------------------------------------------------------------------------
extern "C" __global__ void crossentropy_forward_backward(floatX* logits, float* losses,
                                                         const int* targets, int BT, int V,
                                                         int Vp, float dloss) {
    if (BT <= 0 || V <= 0 || Vp < V) return;
    for (long long row = blockIdx.x; row < BT; row += gridDim.x) {
        floatX* x = logits + row * Vp;
        const int target = targets[row];
        const bool valid = target >= 0 && target < V;
        // Read before the reductions: after the last one, threads start overwriting the row.
        const float x_target = valid ? ldx(x[target]) : 0.0f;
        // One pass for the maximum and the sum of exponentials (an online softmax: the sum
        // rescaled whenever the running maximum grows), then one for the gradient.
        float m = NEG_INF;
        float sm = 0.0f;
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float v = ldx(x[j]);
            if (v > m) {
                sm = sm * expf(m - v) + 1.0f;
                m = v;
            } else if (v != NEG_INF) {  // (-inf adds nothing; exp(-inf - -inf) would be NaN)
                sm += expf(v - m);
            }
        }
        const float mx = block_max(m);
        const float s = block_sum(m == NEG_INF ? 0.0f : sm * expf(m - mx));
        // every read of the row for the reductions happens before this barrier
        const float inv = 1.0f / s;
        if (threadIdx.x == 0) losses[row] = valid ? logf(s) + mx - x_target : 0.0f;
        for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
            float gj = 0.0f;
            if (valid && j < V) {
                const float p = expf(ldx(x[j]) - mx) * inv;
                gj = (p - (j == target ? 1.0f : 0.0f)) * dloss;
            }
            x[j] = stx(gj);
        }
    }
}

// ------------------------------------------------------------------------------------------
// 6. fill_zero: p[0..n) = 0.
// ------------------------------------------------------------------------------------------
extern "C" __global__ void fill_zero(floatX* p, long long n) {
    GS_LOOP(i, n) p[i] = stx(0.0f);
}

// ------------------------------------------------------------------------------------------
// Deterministic forms (no floating-point atomics: the same inputs give the same bits, so a
// graph-replayed step equals the eager one exactly), and AdamW with its bias corrections read
// from device memory (a captured step reads the current step's, written before each replay).
// ------------------------------------------------------------------------------------------

// 7. layernorm_backward_partial: ACCUMULATES into dinp.
//     norm = (x - mean) * rstd; dnorm = dout * w;
//     dinp += (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm)) * rstd.
//     Each block handles rows blockIdx.x, blockIdx.x + gridDim.x, ..., summing its rows'
//     weight and bias gradients (dout * norm, dout) in 2*C floats of dynamic shared memory,
//     then WRITES them to partials[blockIdx.x * 2C + c] (c < C: dweight, C <= c < 2C: dbias);
//     partials holds gridDim.x * 2 * C floats. column_sum then adds the partials in
//     block order.
extern "C" __global__ void layernorm_backward_partial(floatX* dinp, float* partials,
                                                      const floatX* dout, const floatX* inp,
                                                      const floatX* weight, const float* mean,
                                                      const float* rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    extern __shared__ float lnp_smem[];
    float* acc_dw = lnp_smem;
    float* acc_db = lnp_smem + C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        acc_dw[c] = 0.0f;
        acc_db[c] = 0.0f;
    }
    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        const floatX* x = inp + row * C;
        const floatX* g = dout + row * C;
        floatX* dx = dinp + row * C;
        const float m = mean[row];
        const float r = rstd[row];
        float s_dnorm = 0.0f;
        float s_dnorm_norm = 0.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float norm = (ldx(x[c]) - m) * r;
            const float dnorm = ldx(g[c]) * ldx(weight[c]);
            s_dnorm += dnorm;
            s_dnorm_norm += dnorm * norm;
        }
        const float mean_dnorm = block_sum(s_dnorm) / (float)C;
        const float mean_dnorm_norm = block_sum(s_dnorm_norm) / (float)C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float norm = (ldx(x[c]) - m) * r;
            const float go = ldx(g[c]);
            const float dnorm = go * ldx(weight[c]);
            dx[c] = stx(ldx(dx[c]) + (dnorm - mean_dnorm - norm * mean_dnorm_norm) * r);
            acc_dw[c] += go * norm;
            acc_db[c] += go;
        }
    }
    float* out = partials + (long long)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        out[c] = acc_dw[c];
        out[C + c] = acc_db[c];
    }
}

// 8. column_sum: dweight[c] = sum_g partials[g*2C + c], dbias[c] = sum_g partials[g*2C + C
//    + c], summed in g order (OVERWRITE: each layer norm's parameters get one gradient per
//    step). One thread per column of the 2C: grid ceil(2C / 256), block 256.
extern "C" __global__ void column_sum(floatX* dweight, floatX* dbias,
                                                 const float* partials, int G, int C) {
    if (G <= 0 || C <= 0) return;
    GS_LOOP(j, 2LL * C) {
        float s = 0.0f;
        for (int g = 0; g < G; ++g) s += partials[(long long)g * 2 * C + j];
        if (j < C) {
            dweight[j] = stx(s);
        } else {
            dbias[j - C] = stx(s);
        }
    }
}

// 9. encoder_backward_wpe: dwpe[t, c] = sum_b dout[b, t, c], b in order (OVERWRITE). One thread per
//     (t, c): grid ceil(T*C / 256), block 256.
extern "C" __global__ void encoder_backward_wpe(floatX* dwpe, const floatX* dout, int B, int T,
                                                int C) {
    if (B <= 0 || T <= 0 || C <= 0) return;
    const long long TC = (long long)T * C;
    GS_LOOP(i, TC) {
        float s = 0.0f;
        for (int b = 0; b < B; ++b) s += ldx(dout[(long long)b * TC + i]);
        dwpe[i] = stx(s);
    }
}

// 10. encoder_backward_wte: the positions of each distinct token, sorted on the host:
//     for u < *n_unique, dwte[uniq[u], c] += sum over i in [starts[u], starts[u+1]) of
//     dout[order[i], c], in i order. order: BT positions; uniq: n_unique token ids;
//     starts: n_unique + 1 offsets; n_unique read from device memory (a captured step reads
//     the current batch's). One thread per (u, c) up to BT*C: grid ceil(BT*C / 256), block 256.
extern "C" __global__ void encoder_backward_wte(floatX* dwte, const floatX* dout, const int* order,
                                                const int* starts, const int* uniq,
                                                const int* n_unique, int BT, int C, int V) {
    if (BT <= 0 || C <= 0) return;
    const long long nu = (long long)min(max(*n_unique, 0), BT);
    GS_LOOP(i, nu * C) {
        const long long u = i / C;
        const long long c = i % C;
        const int tok = uniq[u];
        if (tok < 0 || tok >= V) continue;
        const int s0 = max(starts[u], 0);
        const int s1 = min(starts[u + 1], BT);
        float s = 0.0f;
        for (int j = s0; j < s1; ++j) {
            const int pos = order[j];
            if (pos >= 0 && pos < BT) s += ldx(dout[(long long)pos * C + c]);
        }
        const long long at = (long long)tok * C + c;
        dwte[at] = stx(ldx(dwte[at]) + s);
    }
}

// 11. adamw_begin_step: one thread counts the step (*step += 1, from 0) and writes its bias
//      corrections, corrections[0] = 1 - beta1^t and corrections[1] = 1 - beta2^t, computed
//      in double like PyTorch's (Python float) bias corrections. Grid 1, block 32 (thread 0
//      works). Launched before adamw_update_dev in the same stream (and graph).
extern "C" __global__ void adamw_begin_step(int* step, float* corrections, float beta1,
                                            float beta2) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const int t = *step + 1;
    *step = t;
    corrections[0] = (float)(1.0 - pow((double)beta1, (double)t));
    corrections[1] = (float)(1.0 - pow((double)beta2, (double)t));
}

// 12. adamw_update_dev: PyTorch's AdamW (torch.optim.AdamW, amsgrad=False): p *= 1 - lr*wd;
//     m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
//     p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), with bc1 = corrections[0] = 1 - beta1^t
//     and bc2 = corrections[1] = 1 - beta2^t read from device memory (a replayed step reads
//     the current step's). params are the float master weights; params_x receives their
//     floatX copy (the weights the matmuls read in bf16) unless it is params itself (f32);
//     grads are floatX.
extern "C" __global__ void adamw_update_dev(float* params, floatX* params_x, const floatX* grads,
                                            float* m, float* v, long long n, float lr,
                                            float beta1, float beta2, const float* corrections,
                                            float eps, float weight_decay) {
    const float bc1 = corrections[0];
    const float bc2 = corrections[1];
    const float step_size = lr / bc1;
    const float bc2_sqrt = sqrtf(bc2);
    const bool write_x = (const void*)params_x != (const void*)params;
    GS_LOOP(i, n) {
        float p = params[i];
        const float g = ldx(grads[i]);
        p *= 1.0f - lr * weight_decay;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        params[i] = p;
        if (write_x) params_x[i] = stx(p);
    }
}

__device__ __forceinline__ float gelu(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    // 0.5 x (1 + tanh(u)) = x (1 - 1 / (exp(2u) + 1)) (one accurate expf; +-inf give x and 0)
    return x * (1.0f - 1.0f / (expf(2.0f * u) + 1.0f));
}

// 13. gelu_forward: out = GELU(inp) with the tanh approximation (cuBLASLt's GELU epilogue and
//     PyTorch's approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The
//     backward recomputes the MLP's activation from its saved pre-activation with it.
extern "C" __global__ void gelu_forward(floatX* out, const floatX* inp, long long n) {
    // 16-byte loads and stores when both buffers allow them; the rest one element at a time.
    const int W = 16 / (int)sizeof(floatX);
    const bool vec = ((unsigned long long)out % 16 == 0) && ((unsigned long long)inp % 16 == 0);
    const long long nv = vec && n > 0 ? n / W : 0;
    GS_LOOP(i, nv) {
        uint4 a = reinterpret_cast<const uint4*>(inp)[i];
        uint4 o;
        const floatX* xs = reinterpret_cast<const floatX*>(&a);
        floatX* os = reinterpret_cast<floatX*>(&o);
        for (int j = 0; j < W; ++j) os[j] = stx(gelu(ldx(xs[j])));
        reinterpret_cast<uint4*>(out)[i] = o;
    }
    for (long long i = nv * W + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = stx(gelu(ldx(inp[i])));
    }
}
