/*
 * Error checks shared by the C test programs (smoke.c, fixture2.c, graph.c, batch.c): every CUDA,
 * cuBLAS and NCCL call is checked, and a failure ends the program with exit status 1 and a
 * message naming the call. Include after the CUDA headers, with PROGRAM defined as the
 * program's name (a string literal); g_rank is the rank messages name.
 */
#ifndef TTRACE_TEST_CHECK_H
#define TTRACE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int g_rank __attribute__((unused)) = 0;

#define FAIL(...)                                                  \
    do {                                                           \
        fprintf(stderr, "%s: rank %d: FAILED: ", PROGRAM, g_rank); \
        fprintf(stderr, __VA_ARGS__);                              \
        fprintf(stderr, "\n");                                     \
        exit(1);                                                   \
    } while (0)

#define CK_CUDA(call)                                                                       \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) FAIL("%s: %s (%d)", #call, cudaGetErrorString(e_), (int)e_); \
    } while (0)

#define CK_CUBLAS(call)                                                         \
    do {                                                                        \
        cublasStatus_t s_ = (call);                                             \
        if (s_ != CUBLAS_STATUS_SUCCESS) FAIL("%s: status %d", #call, (int)s_); \
    } while (0)

#define CK_NCCL(call)                                                                       \
    do {                                                                                    \
        ncclResult_t r_ = (call);                                                           \
        if (r_ != ncclSuccess) FAIL("%s: %s (%d)", #call, ncclGetErrorString(r_), (int)r_); \
    } while (0)

#endif
