/*
 * A C program written against NVIDIA's legacy cuBLAS API (cublas.h: no handle, errors from
 * cublasGetError), which libcublas still exports beside the _v2 API:
 *  1. cublasInit; two vectors uploaded with cublasSetVector (a name both APIs share);
 *  2. cublasSscal (x = 2 x) and cublasSdot (x . y, returned by value), checked;
 *  3. cublasSgemm (legacy arguments: char transposes, scalars by value), whose status
 *     cublasGetError gives (the simulator does not compute it: CUBLAS_STATUS_NOT_SUPPORTED;
 *     NVIDIA's cuBLAS: success), C checked when it succeeded;
 *  4. x read back with cublasGetVector and checked;
 *  5. cublasSdot again while another stream captures a graph (querying the legacy stream is
 *     then an error: its status is read and not checked); cublasShutdown.
 * Prints "blas_legacy: stream 0x0" (the legacy default stream) first and "blas_legacy: OK"
 * last; exit status 1 on a failure.
 */
#include <cublas.h>
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>

#define PROGRAM "blas_legacy"
#include "check.h"

#define N 6

int main(void) {
    printf("blas_legacy: stream 0x0\n");
    CK_CUBLAS(cublasInit());
    float x[N], y[N], back[N];
    for (int i = 0; i < N; i++) {
        x[i] = 0.5f * (float)i + 1.0f;
        y[i] = 2.0f - (float)i;
    }
    float *dx, *dy, *da, *dc;
    CK_CUDA(cudaMalloc((void **)&dx, sizeof x));
    CK_CUDA(cudaMalloc((void **)&dy, sizeof y));
    CK_CUDA(cudaMalloc((void **)&da, 4 * sizeof(float)));
    CK_CUDA(cudaMalloc((void **)&dc, 4 * sizeof(float)));
    CK_CUBLAS(cublasSetVector(N, sizeof(float), x, 1, dx, 1));
    CK_CUBLAS(cublasSetVector(N, sizeof(float), y, 1, dy, 1));

    cublasSscal(N, 2.0f, dx, 1);
    CK_CUBLAS(cublasGetError());
    float dot = cublasSdot(N, dx, 1, dy, 1);
    CK_CUBLAS(cublasGetError());
    float want = 0.0f;
    for (int i = 0; i < N; i++) want += 2.0f * x[i] * y[i];
    if (fabsf(dot - want) > 1e-4f * (1.0f + fabsf(want)))
        FAIL("cublasSdot: %g, want %g", (double)dot, (double)want);

    /* C (2 x 2) = A^T A, A 2 x 2 = [1 2; 3 4] column-major. */
    float a[4] = {1.0f, 3.0f, 2.0f, 4.0f}, c[4];
    CK_CUBLAS(cublasSetVector(4, sizeof(float), a, 1, da, 1));
    cublasSgemm('T', 'N', 2, 2, 2, 1.0f, da, 2, da, 2, 0.0f, dc, 2);
    cublasStatus_t st = cublasGetError();
    if (st == CUBLAS_STATUS_SUCCESS) {
        CK_CUBLAS(cublasGetVector(4, sizeof(float), dc, 1, c, 1));
        const float want_c[4] = {10.0f, 14.0f, 14.0f, 20.0f};
        for (int i = 0; i < 4; i++)
            if (c[i] != want_c[i]) FAIL("cublasSgemm: C[%d] = %g, want %g", i, (double)c[i], (double)want_c[i]);
    } else if (st != CUBLAS_STATUS_NOT_SUPPORTED) {
        FAIL("cublasSgemm: status %d", (int)st);
    }

    CK_CUBLAS(cublasGetVector(N, sizeof(float), dx, 1, back, 1));
    for (int i = 0; i < N; i++)
        if (back[i] != 2.0f * x[i]) FAIL("cublasSscal: x[%d] = %g, want %g", i, (double)back[i], (double)(2.0f * x[i]));
    cudaStream_t cs;
    CK_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK_CUDA(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    (void)cublasSdot(N, dx, 1, dy, 1);
    (void)cublasGetError();
    cudaGraph_t g;
    CK_CUDA(cudaStreamEndCapture(cs, &g));
    CK_CUDA(cudaGraphDestroy(g));
    CK_CUDA(cudaStreamDestroy(cs));
    CK_CUDA(cudaFree(dx));
    CK_CUDA(cudaFree(dy));
    CK_CUDA(cudaFree(da));
    CK_CUDA(cudaFree(dc));
    CK_CUBLAS(cublasShutdown());
    printf("blas_legacy: OK\n");
    return 0;
}
