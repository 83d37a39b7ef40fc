/*
 * A one-rank NCCL program written only against NVIDIA's headers: an all-reduce out of place,
 * then one in place inside ncclGroupStart/ncclGroupEnd, each result checked (a one-rank sum is
 * its input). Prints "nccl_groups: stream 0x..." first and "nccl_groups: OK" at the end; exit
 * status 1 on a failure.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdio.h>

#define PROGRAM "nccl_groups"
#include "check.h"

#define N 8

int main(void) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("nccl_groups: stream %p\n", (void *)s);
    ncclUniqueId id;
    ncclComm_t comm;
    CK_NCCL(ncclGetUniqueId(&id));
    CK_NCCL(ncclCommInitRank(&comm, 1, id, 0));

    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = 0.5f * (float)i - 1.0f;
    float *a, *b;
    CK_CUDA(cudaMalloc((void **)&a, sizeof h));
    CK_CUDA(cudaMalloc((void **)&b, sizeof h));
    CK_CUDA(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));

    /* Out of place, then in place in a group. */
    CK_NCCL(ncclAllReduce(a, b, N, ncclFloat, ncclSum, comm, s));
    CK_NCCL(ncclGroupStart());
    CK_NCCL(ncclAllReduce(b, b, N, ncclFloat, ncclSum, comm, s));
    CK_NCCL(ncclGroupEnd());
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(back, b, sizeof back, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        if (back[i] != h[i]) FAIL("all-reduce [%d] = %g, want %g", i, (double)back[i], (double)h[i]);

    CK_NCCL(ncclCommDestroy(comm));
    CK_CUDA(cudaFree(a));
    CK_CUDA(cudaFree(b));
    CK_CUDA(cudaStreamDestroy(s));
    printf("nccl_groups: OK\n");
    return 0;
}
