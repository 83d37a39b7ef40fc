/*
 * A C program written only against NVIDIA's headers (CUDA 12.8+ or CUDA 13) that moves
 * tensors with cudaMemcpyBatchAsync and cudaMemcpy3DBatchAsync, whose signatures differ between
 * the two: CUDA 12.8's have a failIdx out-parameter, CUDA 13's none.
 *
 * Prints "batch: stream 0x..." (the created stream's handle), then runs on that stream:
 *  1. an upload batch: a pageable source read during the call (then overwritten at once, as
 *     cudaMemcpySrcAccessOrderDuringApiCall allows), a pinned source read in stream order, and
 *     a device-to-device copy of a buffer uploaded before;
 *  2. a download batch of two of the results into pinned memory;
 *  3. (CUDA 13) cudaMemcpyWithAttributesAsync of the pinned values into a device buffer;
 *  4. a cudaMemcpy3DBatchAsync of two pointer-to-pointer 3-D copies (a pitched destination,
 *     a source on the stack read during the call) and (CUDA 13) cudaMemcpy3DWithAttributesAsync;
 *  5. a batch with an invalid source access order on its second attribute set: it must fail
 *     with cudaErrorInvalidValue (CUDA 12: failIdx names copy 1) and move nothing.
 * Every byte is checked; prints "batch: OK", exit status 1 on a failure.
 */
#include <cuda_runtime_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "batch"
#include "check.h"

#define NA 4096 /* floats: the pinned upload */
#define NB 48   /* floats: the pageable upload */
#define NC 1000 /* floats: the device-to-device copy */

/* cudaMemcpyBatchAsync as this header set declares it; `fail` is left alone by CUDA 13. */
static cudaError_t batch(void **dsts, void **srcs, size_t *sizes, size_t count,
                         struct cudaMemcpyAttributes *attrs, size_t *idxs, size_t nattrs,
                         size_t *fail, cudaStream_t s) {
#if CUDART_VERSION >= 13000
    (void)fail;
    return cudaMemcpyBatchAsync(dsts, (const void *const *)srcs, sizes, count, attrs, idxs,
                                nattrs, s);
#else
    return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, s);
#endif
}

static struct cudaMemcpyAttributes order(enum cudaMemcpySrcAccessOrder o) {
    struct cudaMemcpyAttributes a;
    memset(&a, 0, sizeof a);
    a.srcAccessOrder = o;
    return a;
}

static float value_a(int j) { return (float)j * 0.5f - 3.0f; }
static float value_b(int j) { return 100.0f + (float)j; }
static float value_d(int j) { return (float)(j % 13) - 6.0f; }

int main(void) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("batch: stream %p\n", (void *)s);
    float *da, *db, *dc, *dd, *ha, *out_a, *out_c;
    CK_CUDA(cudaMalloc((void **)&da, sizeof(float) * NA));
    CK_CUDA(cudaMalloc((void **)&db, sizeof(float) * NB));
    CK_CUDA(cudaMalloc((void **)&dc, sizeof(float) * NC));
    CK_CUDA(cudaMalloc((void **)&dd, sizeof(float) * NC));
    CK_CUDA(cudaMallocHost((void **)&ha, sizeof(float) * NA));
    CK_CUDA(cudaMallocHost((void **)&out_a, sizeof(float) * NA));
    CK_CUDA(cudaMallocHost((void **)&out_c, sizeof(float) * NC));
    float *hb = malloc(sizeof(float) * NB), *hd = malloc(sizeof(float) * NC);
    float *back_b = malloc(sizeof(float) * NB);
    if (!hb || !hd || !back_b) FAIL("malloc");
    for (int j = 0; j < NA; j++) ha[j] = value_a(j);
    for (int j = 0; j < NB; j++) hb[j] = value_b(j);
    for (int j = 0; j < NC; j++) hd[j] = value_d(j);
    CK_CUDA(cudaMemcpy(dd, hd, sizeof(float) * NC, cudaMemcpyHostToDevice));

    /* 1. Uploads and a device-to-device copy. */
    void *dsts1[3] = {db, da, dc};
    void *srcs1[3] = {hb, ha, dd};
    size_t sizes1[3] = {sizeof(float) * NB, sizeof(float) * NA, sizeof(float) * NC};
    struct cudaMemcpyAttributes attrs1[2] = {order(cudaMemcpySrcAccessOrderDuringApiCall),
                                             order(cudaMemcpySrcAccessOrderStream)};
    size_t idxs1[2] = {0, 1};
    size_t fail = 0;
    CK_CUDA(batch(dsts1, srcs1, sizes1, 3, attrs1, idxs1, 2, &fail, s));
    for (int j = 0; j < NB; j++) hb[j] = -1.0f; /* read during the call: free to reuse */
    CK_CUDA(cudaStreamSynchronize(s));

    /* 2. Downloads. */
    void *dsts2[2] = {out_a, out_c};
    void *srcs2[2] = {da, dc};
    size_t sizes2[2] = {sizeof(float) * NA, sizeof(float) * NC};
    struct cudaMemcpyAttributes attrs2[1] = {order(cudaMemcpySrcAccessOrderStream)};
    size_t idxs2[1] = {0};
    CK_CUDA(batch(dsts2, srcs2, sizes2, 2, attrs2, idxs2, 1, &fail, s));
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(back_b, db, sizeof(float) * NB, cudaMemcpyDeviceToHost));
    for (int j = 0; j < NA; j++)
        if (out_a[j] != value_a(j)) FAIL("pinned upload: element %d is %g", j, out_a[j]);
    for (int j = 0; j < NB; j++)
        if (back_b[j] != value_b(j)) FAIL("pageable upload: element %d is %g", j, back_b[j]);
    for (int j = 0; j < NC; j++)
        if (out_c[j] != value_d(j)) FAIL("device copy: element %d is %g", j, out_c[j]);

#if CUDART_VERSION >= 13000
    /* CUDA 13's single copy with attributes: the pinned values again, into the device
     * buffer of the device-to-device copy's source (read back below). */
    struct cudaMemcpyAttributes one = order(cudaMemcpySrcAccessOrderStream);
    CK_CUDA(cudaMemcpyWithAttributesAsync(dd, ha, sizeof(float) * NC, &one, s));
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(hd, dd, sizeof(float) * NC, cudaMemcpyDeviceToHost));
    for (int j = 0; j < NC; j++)
        if (hd[j] != value_a(j)) FAIL("copy with attributes: element %d is %g", j, hd[j]);
#endif

    /* 4. Two 3-D copies in one batch: 10 x 4 x 2 bytes from the stack (read during the call)
     * into a pitched device block (rows of 16 bytes, layers of 5 rows), and the first 80 bytes
     * of `dd` into a packed device buffer; CUDA 13 then copies the latter again with
     * cudaMemcpy3DWithAttributesAsync. Read back and checked. */
    unsigned char *pitched3, *packed3, block[80], want3[80], got3[160];
    CK_CUDA(cudaMalloc((void **)&pitched3, sizeof got3));
    CK_CUDA(cudaMalloc((void **)&packed3, sizeof want3));
    CK_CUDA(cudaMemset(pitched3, 0, sizeof got3));
    CK_CUDA(cudaMemcpy(want3, dd, sizeof want3, cudaMemcpyDeviceToHost));
    for (int j = 0; j < 80; j++) block[j] = (unsigned char)(j * 3 + 1);
    struct cudaMemcpy3DBatchOp ops[2];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 2; i++) {
        ops[i].src.type = cudaMemcpyOperandTypePointer;
        ops[i].dst.type = cudaMemcpyOperandTypePointer;
        ops[i].extent.width = 10;
        ops[i].extent.height = 4;
        ops[i].extent.depth = 2;
    }
    ops[0].src.op.ptr.ptr = block;
    ops[0].dst.op.ptr.ptr = pitched3;
    ops[0].dst.op.ptr.rowLength = 16;
    ops[0].dst.op.ptr.layerHeight = 5;
    ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    ops[1].src.op.ptr.ptr = dd;
    ops[1].dst.op.ptr.ptr = packed3;
    ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
#if CUDART_VERSION >= 13000
    CK_CUDA(cudaMemcpy3DBatchAsync(2, ops, 0, s));
    CK_CUDA(cudaMemcpy3DWithAttributesAsync(&ops[1], 0, s));
#else
    CK_CUDA(cudaMemcpy3DBatchAsync(2, ops, &fail, 0, s));
#endif
    memset(block, 0, sizeof block); /* read during the call: free to reuse */
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(got3, pitched3, sizeof got3, cudaMemcpyDeviceToHost));
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 5; y++)
            for (int x = 0; x < 16; x++) {
                int in = y < 4 && x < 10;
                unsigned char w = in ? (unsigned char)((z * 40 + y * 10 + x) * 3 + 1) : 0;
                if (got3[z * 80 + y * 16 + x] != w) FAIL("3-D batch: byte (%d, %d, %d)", x, y, z);
            }
    CK_CUDA(cudaMemcpy(got3, packed3, sizeof want3, cudaMemcpyDeviceToHost));
    if (memcmp(got3, want3, sizeof want3) != 0) FAIL("3-D batch: the packed copy differs");

    /* 5. Refused: the second attribute set has no source access order. */
    struct cudaMemcpyAttributes attrs3[2] = {order(cudaMemcpySrcAccessOrderStream),
                                             order(cudaMemcpySrcAccessOrderInvalid)};
    fail = 7;
    cudaError_t e = batch(dsts1, srcs1, sizes1, 3, attrs3, idxs1, 2, &fail, s);
    if (e != cudaErrorInvalidValue) FAIL("the invalid batch returned %d", (int)e);
#if CUDART_VERSION < 13000
    if (fail != 1) FAIL("the invalid batch's failIdx is %zu, not 1", fail);
#endif
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(back_b, db, sizeof(float) * NB, cudaMemcpyDeviceToHost));
    if (back_b[0] != value_b(0)) FAIL("the invalid batch moved bytes");
    printf("batch: OK\n");
    return 0;
}
