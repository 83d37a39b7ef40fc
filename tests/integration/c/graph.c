/*
 * A C program written only against NVIDIA's headers (CUDA 12 or CUDA 13) that uses a CUDA
 * graph as torch.cuda.graph does: one step captured in global mode on a created stream, then
 * replayed with new inputs.
 *
 * The step: cudaMemcpyAsync of the input B from a pinned staging buffer to the device,
 * cublasGemmEx (f32, C = A * B, A 8x16, B 16x4), and an in-place ncclAllReduce (sum) of C over
 * a one-rank communicator (ncclCommInitAll). It is captured once, instantiated with
 * cudaGraphInstantiateWithFlags (with argv[2] "params": cudaGraphInstantiateWithParams,
 * uploading on the stream; with "destroy-early": the graph is destroyed right after it was
 * instantiated, as PyTorch's CUDAGraph::capture_end does; with "driver": captured,
 * instantiated, launched and destroyed through the driver API, cuStreamBeginCapture to
 * cuGraphDestroy, the graph destroyed early too; with "driver-child": as XLA's command buffers
 * do, the captured graph becomes a child-graph node of a graph made with cuGraphCreate, which
 * is instantiated and launched), and launched REPLAYS times (argv[1], default 3); before
 * replay i the staging buffer is refilled with graph_input(i, .). Each replay's result is
 * checked against a host GEMM (the inputs are small multiples of 1/2: exact in f32).
 * Prints "graph: replay I ok" per replay and "graph: OK"; exit status 1 on a failure.
 */
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M 8
#define N 4
#define K 16

#define PROGRAM "graph"
#include "check.h"

#define CK_CU(call)                                   \
    do {                                              \
        CUresult r_ = (call);                         \
        if (r_ != CUDA_SUCCESS) FAIL("%s: CUresult %d", #call, (int)r_); \
    } while (0)

/* A (column-major, lda = M): fixed. B of replay i (column-major, ldb = K). */
static float graph_weight(int j) { return (float)((j * 7 % 9) - 4) * 0.5f; }
static float graph_input(int i, int j) { return (float)(((j * 5 + i * 3) % 7) - 3) * 0.5f; }

int main(int argc, char **argv) {
    int replays = argc > 1 ? atoi(argv[1]) : 3;
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *a, *b, *c, *staging, *host_a, *out;
    CK_CUDA(cudaMalloc((void **)&a, sizeof(float) * M * K));
    CK_CUDA(cudaMalloc((void **)&b, sizeof(float) * K * N));
    CK_CUDA(cudaMalloc((void **)&c, sizeof(float) * M * N));
    CK_CUDA(cudaMallocHost((void **)&staging, sizeof(float) * K * N));
    CK_CUDA(cudaMallocHost((void **)&host_a, sizeof(float) * M * K));
    CK_CUDA(cudaMallocHost((void **)&out, sizeof(float) * M * N));
    for (int j = 0; j < M * K; j++) host_a[j] = graph_weight(j);
    CK_CUDA(cudaMemcpyAsync(a, host_a, sizeof(float) * M * K, cudaMemcpyHostToDevice, s));

    cublasHandle_t h;
    CK_CUBLAS(cublasCreate(&h));
    CK_CUBLAS(cublasSetStream(h, s));
    ncclComm_t comm;
    int dev = 0;
    CK_NCCL(ncclCommInitAll(&comm, 1, &dev));
    CK_CUDA(cudaStreamSynchronize(s));

    const float alpha = 1.0f, beta = 0.0f;
    const char *how = argc > 2 ? argv[2] : "";
    int driver = strncmp(how, "driver", 6) == 0, child = strcmp(how, "driver-child") == 0;
    if (driver)
        CK_CU(cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    else
        CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK_CUDA(cudaMemcpyAsync(b, staging, sizeof(float) * K * N, cudaMemcpyHostToDevice, s));
    CK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &alpha, a, CUDA_R_32F, M, b,
                           CUDA_R_32F, K, &beta, c, CUDA_R_32F, M, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
    CK_NCCL(ncclAllReduce(c, c, M * N, ncclFloat32, ncclSum, comm, s));
    cudaGraph_t graph, traced = NULL;
    if (driver)
        CK_CU(cuStreamEndCapture((CUstream)s, (CUgraph *)&graph));
    else
        CK_CUDA(cudaStreamEndCapture(s, &graph));
    if (child) { /* the captured graph is one node of the graph launched */
        traced = graph;
        CUgraphNode node;
        CK_CU(cuGraphCreate((CUgraph *)&graph, 0));
        CK_CU(cuGraphAddChildGraphNode(&node, (CUgraph)graph, NULL, 0, (CUgraph)traced));
    }
    cudaGraphExec_t exec;
    if (driver) {
        CK_CU(cuGraphInstantiate((CUgraphExec *)&exec, (CUgraph)graph, 0));
    } else if (strcmp(how, "params") == 0) { /* the parameter-block spelling, uploading on the stream */
        cudaGraphInstantiateParams p = {0};
        p.flags = cudaGraphInstantiateFlagUpload;
        p.uploadStream = s;
        CK_CUDA(cudaGraphInstantiateWithParams(&exec, graph, &p));
        if (p.result_out != cudaGraphInstantiateSuccess) FAIL("instantiate result %d", (int)p.result_out);
    } else {
        CK_CUDA(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    }
    int destroyed = strcmp(how, "destroy-early") == 0 || driver;
    if (driver) { /* the instance lives on */
        CK_CU(cuGraphDestroy((CUgraph)graph));
        if (traced) CK_CU(cuGraphDestroy((CUgraph)traced));
    } else if (destroyed) {
        CK_CUDA(cudaGraphDestroy(graph));
    }

    for (int i = 0; i < replays; i++) {
        for (int j = 0; j < K * N; j++) staging[j] = graph_input(i, j);
        if (driver)
            CK_CU(cuGraphLaunch((CUgraphExec)exec, (CUstream)s));
        else
            CK_CUDA(cudaGraphLaunch(exec, s));
        CK_CUDA(cudaMemcpyAsync(out, c, sizeof(float) * M * N, cudaMemcpyDeviceToHost, s));
        CK_CUDA(cudaStreamSynchronize(s));
        for (int col = 0; col < N; col++)
            for (int row = 0; row < M; row++) {
                double want = 0;
                for (int p = 0; p < K; p++)
                    want += (double)graph_weight(row + p * M) * graph_input(i, p + col * K);
                if (out[row + col * M] != (float)want)
                    FAIL("replay %d: C[%d,%d] = %g, expected %g", i, row, col,
                         (double)out[row + col * M], want);
            }
        printf("graph: replay %d ok\n", i);
    }
    if (driver)
        CK_CU(cuGraphExecDestroy((CUgraphExec)exec));
    else
        CK_CUDA(cudaGraphExecDestroy(exec));
    if (!destroyed) CK_CUDA(cudaGraphDestroy(graph));
    CK_NCCL(ncclCommDestroy(comm));
    CK_CUBLAS(cublasDestroy(h));
    CK_CUDA(cudaStreamDestroy(s));
    printf("graph: OK\n");
    return 0;
}
