/*
 * A C program written only against NVIDIA's headers (CUDA 12 or CUDA 13) that builds a CUDA
 * graph node by node, as frameworks do for their own copy schedules, and one by stream capture.
 *
 * The hand-built graph: an upload node (pinned host -> device, 64 floats), a device-to-device
 * copy node after it, a memset node (another buffer, 32 bytes of 0x5a) and a download node
 * after the device-to-device copy; an empty node joins them. It is instantiated and launched
 * twice on a created stream (prints "graph_nodes: stream 0x..."), the host source refilled
 * between the launches; every byte is checked. Then a cudaMemcpyAsync upload captured into a
 * graph on the same stream, instantiated and launched once, checked.
 * Prints "graph_nodes: OK"; exit status 1 on a failure.
 */
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <string.h>

#define PROGRAM "graph_nodes"
#include "check.h"

#define N 64

int main(void) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("graph_nodes: stream %p\n", (void *)s);
    float *host, *back, *d1, *d2;
    unsigned char *dm, mb[32];
    CK_CUDA(cudaMallocHost((void **)&host, N * sizeof(float)));
    CK_CUDA(cudaMallocHost((void **)&back, N * sizeof(float)));
    CK_CUDA(cudaMalloc((void **)&d1, N * sizeof(float)));
    CK_CUDA(cudaMalloc((void **)&d2, N * sizeof(float)));
    CK_CUDA(cudaMalloc((void **)&dm, sizeof mb));

    cudaGraph_t g;
    CK_CUDA(cudaGraphCreate(&g, 0));
    cudaGraphNode_t up, d2d, set, down, join;
    CK_CUDA(cudaGraphAddMemcpyNode1D(&up, g, NULL, 0, d1, host, N * sizeof(float),
                                     cudaMemcpyHostToDevice));
    CK_CUDA(cudaGraphAddMemcpyNode1D(&d2d, g, &up, 1, d2, d1, N * sizeof(float),
                                     cudaMemcpyDeviceToDevice));
    struct cudaMemsetParams mp;
    memset(&mp, 0, sizeof mp);
    mp.dst = dm;
    mp.value = 0x5a;
    mp.elementSize = 1;
    mp.width = sizeof mb;
    mp.height = 1;
    mp.pitch = sizeof mb;
    CK_CUDA(cudaGraphAddMemsetNode(&set, g, NULL, 0, &mp));
    CK_CUDA(cudaGraphAddMemcpyNode1D(&down, g, &d2d, 1, back, d2, N * sizeof(float),
                                     cudaMemcpyDeviceToHost));
    cudaGraphNode_t deps[2] = {down, set};
    CK_CUDA(cudaGraphAddEmptyNode(&join, g, deps, 2));
    cudaGraphExec_t ge;
    CK_CUDA(cudaGraphInstantiate(&ge, g, 0));
    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < N; i++) host[i] = (float)(launch * 100 + i) * 0.5f;
        memset(back, 0, N * sizeof(float));
        CK_CUDA(cudaGraphLaunch(ge, s));
        CK_CUDA(cudaStreamSynchronize(s));
        for (int i = 0; i < N; i++)
            if (back[i] != host[i]) FAIL("launch %d: back[%d] = %g, want %g", launch, i,
                                         (double)back[i], (double)host[i]);
    }
    CK_CUDA(cudaMemcpy(mb, dm, sizeof mb, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof mb; i++)
        if (mb[i] != 0x5a) FAIL("memset node: byte %zu = %d", i, mb[i]);

    /* A captured graph: its copy is the tracer's to snapshot at each replay. */
    cudaGraph_t cg;
    CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK_CUDA(cudaMemcpyAsync(d1, host, N * sizeof(float), cudaMemcpyHostToDevice, s));
    CK_CUDA(cudaStreamEndCapture(s, &cg));
    cudaGraphExec_t cge;
    CK_CUDA(cudaGraphInstantiate(&cge, cg, 0));
    for (int i = 0; i < N; i++) host[i] = -(float)i;
    CK_CUDA(cudaGraphLaunch(cge, s));
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(back, d1, N * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        if (back[i] != -(float)i) FAIL("captured graph: back[%d] = %g", i, (double)back[i]);

    CK_CUDA(cudaGraphExecDestroy(cge));
    CK_CUDA(cudaGraphDestroy(cg));
    CK_CUDA(cudaGraphExecDestroy(ge));
    CK_CUDA(cudaGraphDestroy(g));
    CK_CUDA(cudaStreamDestroy(s));
    printf("graph_nodes: OK\n");
    return 0;
}
