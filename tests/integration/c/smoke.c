/*
 * A C program written only against NVIDIA's headers, as a CUDA application would be: it links
 * libcudart.so.12, libcublas.so.12, libcublasLt.so.12, libnccl.so.2 and libnvToolsExt.so.1 by
 * soname and runs on NVIDIA's libraries or on the simulated ones alike.
 *
 * Per rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from a torchrun-like
 * launcher; a single rank without them):
 *   1. cudaMalloc + cudaMemcpyAsync on a created stream (pinned host buffers);
 *   2. cublasGemmEx: bf16 A and B, f32 C, 32F compute;
 *   3. cublasLtMatmul: FP8 E4M3 A and B in the TN layout, E4M3 D, bf16 C, with A/B/D scale
 *      pointers and the AMAX_D pointer;
 *   4. ncclAllReduce (sum) of the GEMM results over all ranks, the unique id derived from
 *      NCCL_COMM_ID = MASTER_ADDR:MASTER_PORT so that every rank computes the same one.
 * Each result is compared with a host computation. The inputs are small multiples of 1/2, so
 * every product and sum is exact in f32 and the comparisons are exact, except the FP8 output,
 * which is compared with the host's round-to-nearest-even E4M3 encoding of the exact value.
 * Exit status 0 when every check passed, 1 otherwise (with a message on stderr).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define NVTX_SUPPRESS_V2_DEPRECATION_WARNING 1

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvToolsExt.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "smoke"
#include "check.h"

/* ---- host number formats ------------------------------------------------------------------ */

/* bf16 bits of f (exactly representable here: the inputs are small multiples of 1/2). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0xffffu) != 0) FAIL("%g is not exactly representable in bf16", (double)f);
    return (uint16_t)(u >> 16);
}

/* The E4M3 (OCP FP8, bias 7, no infinities) encoding of x, rounded to nearest even and
 * saturated to the largest finite value, 448. */
static uint8_t to_e4m3(float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (isnan(x)) return 0x7f;
    if (a >= 448.0) return sign | 0x7e;
    int e;
    frexp(a, &e); /* a = f * 2^e with f in [0.5, 1): a's binade is 2^(e-1) */
    int unbiased = e - 1;
    if (unbiased < -6) unbiased = -6; /* subnormals share the smallest exponent */
    double step = ldexp(1.0, unbiased - 3);
    double q = nearbyint(a / step); /* the default rounding mode: to nearest, ties to even */
    double v = q * step;
    if (v >= 448.0) return sign | 0x7e;
    if (v == 0.0) return sign;
    frexp(v, &e);
    unbiased = e - 1; /* rounding may have carried into the next binade */
    if (unbiased < -6) return sign | (uint8_t)(v / ldexp(1.0, -9)); /* subnormal */
    uint8_t mant = (uint8_t)(v / ldexp(1.0, unbiased - 3)) - 8;
    return sign | (uint8_t)((unbiased + 7) << 3) | mant;
}

static float from_e4m3(uint8_t b) {
    int exp = (b >> 3) & 0xf, mant = b & 7;
    double v = exp == 0 ? ldexp(mant, -9) : ldexp(8 + mant, exp - 10);
    return (float)((b & 0x80) ? -v : v);
}

/* ---- inputs ---------------------------------------------------------------------------------- */

/* Deterministic inputs of rank r: multiples of 1/2 in [-2, 2]. */
static float input_a(int r, int i) { return (float)(((i * 7 + r * 3) % 9) - 4) * 0.5f; }
static float input_b(int r, int i) { return (float)(((i * 5 + r * 11) % 7) - 3) * 0.5f; }

/* Column-major m x n product of A (m x k, lda = m) and B (k x n, ldb = k) for rank r. */
static void host_gemm(int r, int m, int n, int k, float *c) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += (double)input_a(r, i + p * m) * input_b(r, p + j * k);
            c[i + j * m] = (float)s;
        }
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* ---- the checks ------------------------------------------------------------------------------ */

/* cublasGemmEx, bf16 x bf16 -> f32; leaves the device result in *d_c (m x n). */
static void check_gemm_ex(cudaStream_t stream, int m, int n, int k, float **d_c) {
    uint16_t *h_a, *h_b;
    float *h_c, *want = malloc(sizeof(float) * m * n);
    void *d_a, *d_b;
    if (!want) FAIL("malloc");
    CK_CUDA(cudaMallocHost((void **)&h_a, sizeof(uint16_t) * m * k));
    CK_CUDA(cudaMallocHost((void **)&h_b, sizeof(uint16_t) * k * n));
    CK_CUDA(cudaMallocHost((void **)&h_c, sizeof(float) * m * n));
    for (int i = 0; i < m * k; i++) h_a[i] = to_bf16(input_a(g_rank, i));
    for (int i = 0; i < k * n; i++) h_b[i] = to_bf16(input_b(g_rank, i));
    CK_CUDA(cudaMalloc(&d_a, sizeof(uint16_t) * m * k));
    CK_CUDA(cudaMalloc(&d_b, sizeof(uint16_t) * k * n));
    CK_CUDA(cudaMalloc((void **)d_c, sizeof(float) * m * n));
    CK_CUDA(cudaMemcpyAsync(d_a, h_a, sizeof(uint16_t) * m * k, cudaMemcpyHostToDevice, stream));
    CK_CUDA(cudaMemcpyAsync(d_b, h_b, sizeof(uint16_t) * k * n, cudaMemcpyHostToDevice, stream));

    cublasHandle_t h;
    CK_CUBLAS(cublasCreate(&h));
    CK_CUBLAS(cublasSetStream(h, stream));
    const float alpha = 1.0f, beta = 0.0f;
    CK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, d_a, CUDA_R_16BF, m, d_b,
                           CUDA_R_16BF, k, &beta, *d_c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
    CK_CUDA(cudaMemcpyAsync(h_c, *d_c, sizeof(float) * m * n, cudaMemcpyDeviceToHost, stream));
    CK_CUDA(cudaStreamSynchronize(stream));

    host_gemm(g_rank, m, n, k, want);
    for (int i = 0; i < m * n; i++)
        if (h_c[i] != want[i]) FAIL("cublasGemmEx: C[%d] = %g, expected %g", i, (double)h_c[i], (double)want[i]);
    printf("smoke: rank %d: cublasGemmEx bf16 %dx%dx%d ok\n", g_rank, m, n, k);

    CK_CUBLAS(cublasDestroy(h));
    CK_CUDA(cudaFree(d_a));
    CK_CUDA(cudaFree(d_b));
    CK_CUDA(cudaFreeHost(h_a));
    CK_CUDA(cudaFreeHost(h_b));
    CK_CUDA(cudaFreeHost(h_c));
    free(want);
}

/* cublasLtMatmul, FP8: D = scale_D * (alpha * scale_A * scale_B * A^T B), AMAX_D = max |.| of
 * the value in parentheses. A is k x m (op T), B is k x n (op N), D and C are m x n. */
static void check_lt_fp8(cudaStream_t stream) {
    enum { M = 32, N = 16, K = 32 };
    const float scales[3] = {0.5f, 0.25f, 4.0f}; /* A, B, D: no two of them cancel */
    uint8_t *h_a, *h_b, *h_d;
    float *h_amax;
    void *d_a, *d_b, *d_c, *d_d, *d_ws;
    float *d_scales, *d_amax;
    const size_t ws_size = 4u << 20;

    CK_CUDA(cudaMallocHost((void **)&h_a, K * M));
    CK_CUDA(cudaMallocHost((void **)&h_b, K * N));
    CK_CUDA(cudaMallocHost((void **)&h_d, M * N));
    CK_CUDA(cudaMallocHost((void **)&h_amax, sizeof(float)));
    /* Integers in [-2, 4] and [-3, 3] (exact in E4M3), chosen so that most results need
     * rounding to E4M3 and some columns are negative. */
    for (int i = 0; i < K * M; i++) h_a[i] = to_e4m3((float)((i * i + 3 * i + g_rank) % 7 - 2));
    for (int i = 0; i < K * N; i++) {
        int v = (i * 7 + 2 * g_rank + i / 3) % 5 - 1;
        h_b[i] = to_e4m3((float)((i / K) % 3 == 1 ? -v : v));
    }
    CK_CUDA(cudaMalloc(&d_a, K * M));
    CK_CUDA(cudaMalloc(&d_b, K * N));
    CK_CUDA(cudaMalloc(&d_c, sizeof(uint16_t) * M * N));
    CK_CUDA(cudaMalloc(&d_d, M * N));
    CK_CUDA(cudaMalloc(&d_ws, ws_size));
    CK_CUDA(cudaMalloc((void **)&d_scales, sizeof scales));
    CK_CUDA(cudaMalloc((void **)&d_amax, sizeof(float)));
    CK_CUDA(cudaMemcpyAsync(d_a, h_a, K * M, cudaMemcpyHostToDevice, stream));
    CK_CUDA(cudaMemcpyAsync(d_b, h_b, K * N, cudaMemcpyHostToDevice, stream));
    CK_CUDA(cudaMemcpyAsync(d_scales, scales, sizeof scales, cudaMemcpyHostToDevice, stream));
    CK_CUDA(cudaMemsetAsync(d_c, 0, sizeof(uint16_t) * M * N, stream));

    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulPreference_t pref;
    CK_CUBLAS(cublasLtCreate(&lt));
    CK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const float *pa = d_scales, *pb = d_scales + 1, *pd = d_scales + 2;
    float *pamax = d_amax;
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &pd, sizeof pd));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &pamax, sizeof pamax));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, M, K));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, N, K));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, M, N, M));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_8F_E4M3, M, N, M));
    CK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws_size, sizeof ws_size));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, ld, pref, 1, &heur, &found));
    if (found < 1) FAIL("cublasLtMatmulAlgoGetHeuristic found no algorithm");
    const float alpha = 1.0f, beta = 0.0f;
    CK_CUBLAS(cublasLtMatmul(lt, op, &alpha, d_a, la, d_b, lb, &beta, d_c, lc, d_d, ld, &heur.algo,
                             d_ws, ws_size, stream));
    CK_CUDA(cudaMemcpyAsync(h_d, d_d, M * N, cudaMemcpyDeviceToHost, stream));
    CK_CUDA(cudaMemcpyAsync(h_amax, d_amax, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CK_CUDA(cudaStreamSynchronize(stream));

    float amax = 0;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            double s = 0;
            for (int p = 0; p < K; p++) s += (double)from_e4m3(h_a[p + i * K]) * from_e4m3(h_b[p + j * K]);
            float t = (float)(alpha * scales[0] * scales[1] * s); /* exact: small multiples of 1/8 */
            if (fabsf(t) > amax) amax = fabsf(t);
            uint8_t want_bits = to_e4m3(scales[2] * t);
            float want = from_e4m3(want_bits), got = from_e4m3(h_d[i + j * M]);
            if (got != want) /* by value: +0 and -0 are both right */
                FAIL("cublasLtMatmul FP8: D[%d,%d] = %g (0x%02x), expected %g (0x%02x)", i, j, (double)got,
                     h_d[i + j * M], (double)want, want_bits);
        }
    if (*h_amax != amax) FAIL("cublasLtMatmul FP8: AMAX_D = %g, expected %g", (double)*h_amax, (double)amax);
    printf("smoke: rank %d: cublasLtMatmul FP8 E4M3 TN %dx%dx%d ok (amax %g)\n", g_rank, M, N, K, (double)amax);

    CK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(la));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(lb));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(lc));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(ld));
    CK_CUBLAS(cublasLtMatmulDescDestroy(op));
    CK_CUBLAS(cublasLtDestroy(lt));
    void *bufs[] = {d_a, d_b, d_c, d_d, d_ws, d_scales, d_amax};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK_CUDA(cudaFree(bufs[i]));
    void *hosts[] = {h_a, h_b, h_d, h_amax};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) CK_CUDA(cudaFreeHost(hosts[i]));
}

/* ncclAllReduce (sum) of every rank's GEMM result d_c (m x n f32). */
static void check_allreduce(cudaStream_t stream, int world, int m, int n, int k, float *d_c) {
    /* Every rank derives the same unique id from NCCL_COMM_ID (rank 0 hosts the bootstrap). */
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (world > 1) {
        if (!addr || !port) FAIL("MASTER_ADDR and MASTER_PORT must be set with WORLD_SIZE > 1");
        char comm_id[256];
        snprintf(comm_id, sizeof comm_id, "%s:%s", addr, port);
        if (setenv("NCCL_COMM_ID", comm_id, 1) != 0) FAIL("setenv NCCL_COMM_ID");
    }
    ncclUniqueId id;
    ncclComm_t comm;
    CK_NCCL(ncclGetUniqueId(&id));
    CK_NCCL(ncclCommInitRank(&comm, world, id, g_rank));
    int count = 0, rank = -1;
    CK_NCCL(ncclCommCount(comm, &count));
    CK_NCCL(ncclCommUserRank(comm, &rank));
    if (count != world || rank != g_rank) FAIL("communicator has rank %d of %d", rank, count);

    float *d_sum, *h_sum, *want = calloc((size_t)m * n, sizeof(float)), *part = malloc(sizeof(float) * m * n);
    if (!want || !part) FAIL("malloc");
    CK_CUDA(cudaMalloc((void **)&d_sum, sizeof(float) * m * n));
    CK_CUDA(cudaMallocHost((void **)&h_sum, sizeof(float) * m * n));
    CK_NCCL(ncclAllReduce(d_c, d_sum, (size_t)m * n, ncclFloat, ncclSum, comm, stream));
    CK_CUDA(cudaMemcpyAsync(h_sum, d_sum, sizeof(float) * m * n, cudaMemcpyDeviceToHost, stream));
    CK_CUDA(cudaStreamSynchronize(stream));
    /* Every partial sum is a small multiple of 1/4: exact in any order. */
    for (int r = 0; r < world; r++) {
        host_gemm(r, m, n, k, part);
        for (int i = 0; i < m * n; i++) want[i] += part[i];
    }
    for (int i = 0; i < m * n; i++)
        if (h_sum[i] != want[i]) FAIL("ncclAllReduce: [%d] = %g, expected %g", i, (double)h_sum[i], (double)want[i]);
    printf("smoke: rank %d: ncclAllReduce sum over %d ranks ok\n", g_rank, world);

    CK_NCCL(ncclCommDestroy(comm));
    CK_CUDA(cudaFree(d_sum));
    CK_CUDA(cudaFreeHost(h_sum));
    free(want);
    free(part);
}

int main(void) {
    g_rank = env_int("RANK", 0);
    int world = env_int("WORLD_SIZE", 1), local = env_int("LOCAL_RANK", 0);
    int devices = 0;
    CK_CUDA(cudaGetDeviceCount(&devices));
    if (devices < 1) FAIL("no CUDA device");
    CK_CUDA(cudaSetDevice(local % devices));
    cudaStream_t stream;
    CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    enum { M = 32, N = 24, K = 40 };
    float *d_c = NULL;
    nvtxRangePushA("smoke");
    check_gemm_ex(stream, M, N, K, &d_c);
    check_lt_fp8(stream);
    check_allreduce(stream, world, M, N, K, d_c);
    /* The level, or NVTX_NO_PUSH_POP_TRACKING when no tool is attached: not an error either way. */
    (void)nvtxRangePop();

    CK_CUDA(cudaFree(d_c));
    CK_CUDA(cudaStreamDestroy(stream));
    printf("smoke: rank %d of %d OK\n", g_rank, world);
    return 0;
}
