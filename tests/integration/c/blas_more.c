/*
 * A C program written only against NVIDIA's headers that moves tensors through cuBLAS's
 * helper copies and computes with cuBLAS routines other than the GEMMs, and with cuBLASLt's
 * matrix transform: the entry points ttrace captures as copies (cublasSetMatrixAsync,
 * cublasGetMatrixAsync, cublasSetVector, cublasGetVector, cublasSetMatrix_64) or records as
 * gaps naming them (cublasSaxpy_v2, cublasSdot_v2, cublasSgeam, cublasLtMatrixTransform).
 *
 * Prints "blas_more: stream 0x..." (the stream the handle works on), then:
 *  1. cublasSetMatrixAsync of a 5 x 3 column-major matrix with lda 7 into ldb 6 on the stream,
 *     cublasGetMatrixAsync of it back (ldb 6 -> 5), checked;
 *  2. cublasSetVector of 10 floats, every second one (incx 2), and cublasGetVector back
 *     (incy 3 on the host), checked;
 *  3. cublasSetMatrix_64 of a 4 x 2 matrix of doubles;
 *  4. cublasSaxpy_v2 (y = 2 x + y), cublasSdot_v2 (host result), cublasSgeam (13 parameters:
 *     C = 1.5 A^T + -1 B, 3 x 5), each checked against the host's arithmetic;
 *  5. cublasLtMatrixTransform (C = 2 A, F32, 4 x 3), checked;
 *  6. a refused cublasSetVector (incx 0): CUBLAS_STATUS_INVALID_VALUE, nothing moved;
 *  7. cuBLAS-XT (cublasXt.h): cublasXtSgemm on host matrices (C = 0.5 A^T B + 2 C, 3 x 2 from
 *     A 4 x 3 and B 4 x 2; 14 parameters, the sizes size_t), checked, after one refused
 *     (lda 2 < 4: CUBLAS_STATUS_INVALID_VALUE).
 * Prints "blas_more: OK"; exit status 1 on a failure.
 */
#include <cublasLt.h>
#include <cublasXt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PROGRAM "blas_more"
#include "check.h"

static void near(const char *what, float got, float want) {
    if (fabsf(got - want) > 1e-4f * (1.0f + fabsf(want)))
        FAIL("%s: %g, want %g", what, (double)got, (double)want);
}

int main(void) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t h;
    CK_CUBLAS(cublasCreate(&h));
    CK_CUBLAS(cublasSetStream(h, s));
    printf("blas_more: stream %p\n", (void *)s);

    /* 1. A 5 x 3 matrix, lda 7 on the host, ldb 6 on the device, and back with ld 5. */
    float a[7 * 3], back[5 * 3];
    for (int i = 0; i < 7 * 3; i++) a[i] = (float)i * 0.25f - 1.0f;
    float *dm;
    CK_CUDA(cudaMalloc((void **)&dm, 6 * 3 * sizeof(float)));
    CK_CUBLAS(cublasSetMatrixAsync(5, 3, sizeof(float), a, 7, dm, 6, s));
    CK_CUBLAS(cublasGetMatrixAsync(5, 3, sizeof(float), dm, 6, back, 5, s));
    CK_CUDA(cudaStreamSynchronize(s));
    for (int c = 0; c < 3; c++)
        for (int r = 0; r < 5; r++) near("matrix round trip", back[c * 5 + r], a[c * 7 + r]);

    /* 2. 10 floats, every second one of the host array, and back every third. */
    float v[20], vback[30];
    for (int i = 0; i < 20; i++) v[i] = 100.0f + (float)i;
    memset(vback, 0, sizeof vback);
    float *dv;
    CK_CUDA(cudaMalloc((void **)&dv, 10 * sizeof(float)));
    CK_CUBLAS(cublasSetVector(10, sizeof(float), v, 2, dv, 1));
    CK_CUBLAS(cublasGetVector(10, sizeof(float), dv, 1, vback, 3));
    for (int i = 0; i < 10; i++) near("vector round trip", vback[3 * i], v[2 * i]);

    /* 3. The 64-bit form: a 4 x 2 matrix of doubles. */
    double m64[8];
    for (int i = 0; i < 8; i++) m64[i] = -2.0 + i;
    double *d64;
    CK_CUDA(cudaMalloc((void **)&d64, sizeof m64));
    CK_CUBLAS(cublasSetMatrix_64(4, 2, sizeof(double), m64, 4, d64, 4));

    /* 4. Level-1 and geam on the handle's stream. */
    float x[10], y[10], want_y[10];
    for (int i = 0; i < 10; i++) {
        x[i] = (float)i - 4.0f;
        y[i] = 0.5f * (float)i;
        want_y[i] = 2.0f * x[i] + y[i];
    }
    float *dx, *dy;
    CK_CUDA(cudaMalloc((void **)&dx, sizeof x));
    CK_CUDA(cudaMalloc((void **)&dy, sizeof y));
    CK_CUDA(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(dy, y, sizeof y, cudaMemcpyHostToDevice));
    const float two = 2.0f;
    CK_CUBLAS(cublasSaxpy(h, 10, &two, dx, 1, dy, 1));
    float dot = 0.0f, want_dot = 0.0f;
    for (int i = 0; i < 10; i++) want_dot += x[i] * want_y[i];
    CK_CUBLAS(cublasSdot(h, 10, dx, 1, dy, 1, &dot));
    near("sdot", dot, want_dot);
    CK_CUDA(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 10; i++) near("saxpy", y[i], want_y[i]);

    /* C (3 x 5) = 1.5 A^T + -1 B, A 5 x 3 (the matrix of step 1, ld 6), B 3 x 5. */
    float b[3 * 5], cm[3 * 5];
    for (int i = 0; i < 15; i++) b[i] = (float)(i % 4) - 1.5f;
    float *db, *dc;
    CK_CUDA(cudaMalloc((void **)&db, sizeof b));
    CK_CUDA(cudaMalloc((void **)&dc, sizeof cm));
    CK_CUDA(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
    const float alpha = 1.5f, beta = -1.0f;
    CK_CUBLAS(cublasSgeam(h, CUBLAS_OP_T, CUBLAS_OP_N, 3, 5, &alpha, dm, 6, &beta, db, 3, dc, 3));
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(cm, dc, sizeof cm, cudaMemcpyDeviceToHost));
    for (int c = 0; c < 5; c++)
        for (int r = 0; r < 3; r++)
            near("sgeam", cm[c * 3 + r], 1.5f * a[r * 7 + c] - b[c * 3 + r]);

    /* 5. cuBLASLt: C (4 x 3) = 2 A, F32, column-major. */
    cublasLtHandle_t lt;
    CK_CUBLAS(cublasLtCreate(&lt));
    cublasLtMatrixTransformDesc_t td;
    CK_CUBLAS(cublasLtMatrixTransformDescCreate(&td, CUDA_R_32F));
    cublasLtMatrixLayout_t la, lc;
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 4, 3, 4));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 4, 3, 4));
    float ta[12], tc[12];
    for (int i = 0; i < 12; i++) ta[i] = (float)i * 0.5f;
    float *dta, *dtc;
    CK_CUDA(cudaMalloc((void **)&dta, sizeof ta));
    CK_CUDA(cudaMalloc((void **)&dtc, sizeof tc));
    CK_CUDA(cudaMemcpy(dta, ta, sizeof ta, cudaMemcpyHostToDevice));
    const float zero = 0.0f;
    CK_CUBLAS(cublasLtMatrixTransform(lt, td, &two, dta, la, &zero, NULL, lc, dtc, lc, s));
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(tc, dtc, sizeof tc, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 12; i++) near("matrix transform", tc[i], 2.0f * ta[i]);

    /* 6. Refused: incx 0. */
    cublasStatus_t st = cublasSetVector(10, sizeof(float), v, 0, dv, 1);
    if (st != CUBLAS_STATUS_INVALID_VALUE) FAIL("cublasSetVector with incx 0: status %d", (int)st);

    /* 7. cuBLAS-XT on host matrices: C (3 x 2, ldc 3) = 0.5 A^T B + 2 C, A 4 x 3 (lda 4),
     *    B 4 x 2 (ldb 5). */
    cublasXtHandle_t xt;
    CK_CUBLAS(cublasXtCreate(&xt));
    int devices[1] = {0};
    CK_CUBLAS(cublasXtDeviceSelect(xt, 1, devices));
    float xa[4 * 3], xb[5 * 2], xc[3 * 2], xc0[3 * 2];
    for (int i = 0; i < 12; i++) xa[i] = (float)i * 0.5f - 2.0f;
    for (int i = 0; i < 10; i++) xb[i] = 1.0f + (float)i * 0.25f;
    for (int i = 0; i < 6; i++) xc[i] = xc0[i] = (float)i - 1.0f;
    float xalpha = 0.5f, xbeta = 2.0f;
    st = cublasXtSgemm(xt, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 4, &xalpha, xa, 2, xb, 5, &xbeta, xc, 3);
    if (st != CUBLAS_STATUS_INVALID_VALUE) FAIL("cublasXtSgemm with lda 2: status %d", (int)st);
    CK_CUBLAS(cublasXtSgemm(xt, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 4, &xalpha, xa, 4, xb, 5, &xbeta,
                            xc, 3));
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 3; i++) {
            float dot = 0.0f;
            for (int l = 0; l < 4; l++) dot += xa[i * 4 + l] * xb[j * 5 + l];
            near("cublasXtSgemm", xc[j * 3 + i], xalpha * dot + xbeta * xc0[j * 3 + i]);
        }
    CK_CUBLAS(cublasXtDestroy(xt));

    CK_CUBLAS(cublasLtMatrixLayoutDestroy(la));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(lc));
    CK_CUBLAS(cublasLtMatrixTransformDescDestroy(td));
    CK_CUBLAS(cublasLtDestroy(lt));
    CK_CUBLAS(cublasDestroy(h));
    CK_CUDA(cudaStreamDestroy(s));
    printf("blas_more: OK\n");
    return 0;
}
