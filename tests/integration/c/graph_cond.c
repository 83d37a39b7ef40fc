/*
 * A C program written only against NVIDIA's CUDA 13 headers that launches a graph holding a
 * conditional node (cudaGraphConditionalHandleCreate, cudaGraphAddNode with an `if` node, CUDA
 * 12.4+), whose body graph uploads a buffer (cudaGraphAddMemcpyNode1D): the shape of XLA's
 * while/conditional command buffers and of torch.cond inside a CUDA graph. The handle's default
 * value (1, assigned at each launch) runs the body. Launched twice with new host values; each
 * time the buffer is read back (cudaMemcpyAsync) and checked. Then the same inside a graph
 * captured from a stream (as torch.cond does): an upload captured with cudaMemcpyAsync, a
 * conditional node added to the graph being captured (cudaStreamGetCaptureInfo's graph), whose
 * body uploads a second buffer, and a child-graph node holding a third upload captured into a
 * graph of its own beforehand; launched twice, the last two buffers checked. Prints
 * "graph_cond: OK"; exit status 1 on a failure.
 */
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>

#define PROGRAM "graph_cond"
#include "check.h"

#define N 256

/* Adds to `graph` an `if` node on a new handle whose default value, 1, every launch assigns;
 * returns its body graph. */
static cudaGraph_t add_if_node(cudaGraph_t graph) {
    cudaGraphConditionalHandle handle;
    CK_CUDA(cudaGraphConditionalHandleCreate(&handle, graph, 1, cudaGraphCondAssignDefault));
    struct cudaGraphNodeParams p = {0};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = cudaGraphCondTypeIf;
    p.conditional.size = 1;
    cudaGraphNode_t node;
    CK_CUDA(cudaGraphAddNode(&node, graph, NULL, NULL, 0, &p));
    return p.conditional.phGraph_out[0];
}

int main(void) {
    float *dev, *host, *back;
    CK_CUDA(cudaMalloc((void **)&dev, sizeof(float) * N));
    CK_CUDA(cudaMallocHost((void **)&host, sizeof(float) * N));
    CK_CUDA(cudaMallocHost((void **)&back, sizeof(float) * N));
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    cudaGraph_t graph;
    CK_CUDA(cudaGraphCreate(&graph, 0));
    cudaGraph_t body = add_if_node(graph);
    cudaGraphNode_t upload;
    CK_CUDA(cudaGraphAddMemcpyNode1D(&upload, body, NULL, 0, dev, host, sizeof(float) * N,
                                     cudaMemcpyHostToDevice));
    cudaGraphExec_t exec;
    CK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < N; i++) host[i] = (float)(i * 3 + launch);
        CK_CUDA(cudaGraphLaunch(exec, s));
        CK_CUDA(cudaMemcpyAsync(back, dev, sizeof(float) * N, cudaMemcpyDeviceToHost, s));
        CK_CUDA(cudaStreamSynchronize(s));
        for (int i = 0; i < N; i++)
            if (back[i] != host[i]) FAIL("launch %d: [%d] = %g, expected %g", launch, i,
                                         (double)back[i], (double)host[i]);
    }
    CK_CUDA(cudaGraphExecDestroy(exec));
    CK_CUDA(cudaGraphDestroy(graph));

    /* A captured graph with a conditional node added during the capture. */
    float *dev2, *host2;
    CK_CUDA(cudaMalloc((void **)&dev2, sizeof(float) * N));
    CK_CUDA(cudaMallocHost((void **)&host2, sizeof(float) * N));
    float *dev3, *host3;
    CK_CUDA(cudaMalloc((void **)&dev3, sizeof(float) * N));
    CK_CUDA(cudaMallocHost((void **)&host3, sizeof(float) * N));
    cudaGraph_t child;
    CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK_CUDA(cudaMemcpyAsync(dev3, host3, sizeof(float) * N, cudaMemcpyHostToDevice, s));
    CK_CUDA(cudaStreamEndCapture(s, &child));
    CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK_CUDA(cudaMemcpyAsync(dev, host, sizeof(float) * N, cudaMemcpyHostToDevice, s));
    enum cudaStreamCaptureStatus status;
    cudaGraph_t capturing;
    CK_CUDA(cudaStreamGetCaptureInfo(s, &status, NULL, &capturing, NULL, NULL, NULL));
    CK_CUDA(cudaGraphAddMemcpyNode1D(&upload, add_if_node(capturing), NULL, 0, dev2, host2,
                                     sizeof(float) * N, cudaMemcpyHostToDevice));
    cudaGraphNode_t nested;
    CK_CUDA(cudaGraphAddChildGraphNode(&nested, capturing, NULL, 0, child));
    cudaGraph_t captured;
    CK_CUDA(cudaStreamEndCapture(s, &captured));
    CK_CUDA(cudaGraphInstantiate(&exec, captured, 0));
    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < N; i++) {
            host[i] = (float)(i + 10 * launch);
            host2[i] = (float)(-i - 10 * launch);
            host3[i] = (float)(2 * i + launch);
        }
        CK_CUDA(cudaGraphLaunch(exec, s));
        CK_CUDA(cudaStreamSynchronize(s));
        CK_CUDA(cudaMemcpy(back, dev2, sizeof(float) * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++)
            if (back[i] != host2[i]) FAIL("captured launch %d: body [%d] = %g", launch, i,
                                          (double)back[i]);
        CK_CUDA(cudaMemcpy(back, dev3, sizeof(float) * N, cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++)
            if (back[i] != host3[i]) FAIL("captured launch %d: child [%d] = %g", launch, i,
                                          (double)back[i]);
    }
    CK_CUDA(cudaGraphExecDestroy(exec));
    CK_CUDA(cudaGraphDestroy(captured));
    CK_CUDA(cudaGraphDestroy(child));
    CK_CUDA(cudaStreamDestroy(s));
    printf("graph_cond: OK\n");
    return 0;
}
