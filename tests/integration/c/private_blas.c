/*
 * A C program written only against NVIDIA's headers that reaches the CUDA runtime and cuBLAS
 * as JAX's XLA plugin does: dlopen without RTLD_GLOBAL, every entry point through
 * dlsym(handle, name). No symbol of either library is linked.
 *
 * argv[1], argv[2]: the runtime's and cuBLAS's sonames or paths; argv[3], optional: a library
 * to dlopen with RTLD_GLOBAL first (another copy of cuBLAS, say).
 * Runs C = A * B (f32, 4 x 3 x 2) with cublasSgemm_v2 after uploading A and B with
 * cudaMemcpy, and checks C. Prints "private_blas: OK"; exit status 1 on a failure.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define PROGRAM "private_blas"
#include "check.h"

/* check.h's CK_CUDA names the error with cudaGetErrorString, which is not linked here. */
#define RT(call)                                         \
    do {                                                 \
        cudaError_t e_ = (call);                         \
        if (e_ != cudaSuccess) FAIL("%s: %d", #call, (int)e_); \
    } while (0)

static void *must(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) FAIL("dlsym %s: %s", name, dlerror());
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) FAIL("usage: private_blas CUDART CUBLAS [GLOBAL_FIRST]");
    if (argc == 4 && !dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL))
        FAIL("dlopen %s: %s", argv[3], dlerror());
    void *rt = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!rt) FAIL("dlopen %s: %s", argv[1], dlerror());
    void *blas = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!blas) FAIL("dlopen %s: %s", argv[2], dlerror());

    __typeof__(&cudaMalloc) malloc_ = (__typeof__(&cudaMalloc))must(rt, "cudaMalloc");
    __typeof__(&cudaMemcpy) memcpy_ = (__typeof__(&cudaMemcpy))must(rt, "cudaMemcpy");
    __typeof__(&cudaFree) free_ = (__typeof__(&cudaFree))must(rt, "cudaFree");
    __typeof__(&cublasCreate_v2) create = (__typeof__(&cublasCreate_v2))must(blas, "cublasCreate_v2");
    __typeof__(&cublasSgemm_v2) sgemm = (__typeof__(&cublasSgemm_v2))must(blas, "cublasSgemm_v2");
    __typeof__(&cublasDestroy_v2) destroy =
        (__typeof__(&cublasDestroy_v2))must(blas, "cublasDestroy_v2");

    enum { M = 4, K = 3, N = 2 };
    float a[M * K], b[K * N], c[M * N];
    for (int i = 0; i < M * K; i++) a[i] = (float)i * 0.5f;
    for (int i = 0; i < K * N; i++) b[i] = (float)(i % 3) - 1.0f;
    float *da, *db, *dc;
    RT(malloc_((void **)&da, sizeof a));
    RT(malloc_((void **)&db, sizeof b));
    RT(malloc_((void **)&dc, sizeof c));
    RT(memcpy_(da, a, sizeof a, cudaMemcpyHostToDevice));
    RT(memcpy_(db, b, sizeof b, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    CK_CUBLAS(create(&h));
    const float one = 1.0f, zero = 0.0f;
    CK_CUBLAS(sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, da, M, db, K, &zero, dc, M));
    RT(memcpy_(c, dc, sizeof c, cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            float want = 0.0f;
            for (int k = 0; k < K; k++) want += a[k * M + i] * b[j * K + k];
            if (c[j * M + i] != want) FAIL("C[%d,%d] = %g, want %g", i, j, (double)c[j * M + i],
                                           (double)want);
        }
    CK_CUBLAS(destroy(h));
    RT(free_(da));
    RT(free_(db));
    RT(free_(dc));
    printf("private_blas: OK\n");
    return 0;
}
