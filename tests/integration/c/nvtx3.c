/*
 * NVTX 3, header-only (as PyTorch, CUB and every CUDA 13 program use it): no NVTX library is
 * linked; the ranges reach a tool only through NVTX's own loader (NVTX_INJECTION64_PATH).
 * Built with NVTX_V2 defined (nvtx2.c), the same program calls the NVTX v2 library
 * (libnvToolsExt.so.1, CUDA 12) instead, whose exports a tool can interpose and which loads a
 * tool the same way.
 * Three iterations, each in a start/end range "started" (not nested: no path) and a range
 * "step" holding a range "outer" > "inner" around a host-to-device copy, then a copy in a
 * range of a domain of its own (its attributes' message) and one in a range named by a string
 * registered in that domain, inside it, then a copy in a range "x-crossed" opened after
 * another of the domain's, which is closed first (NVTX keeps a stack per domain: the domain's
 * pop closes its own range), then a mark "after"; one copy before any range, and a mark
 * "warm-up" before the first CUDA call. Every copy's bytes are checked on the way back. Push
 * and pop must return what NVTX returns without a tool or with one that tracks levels:
 * NVTX_NO_PUSH_POP_TRACKING, or the level.
 */
/* NVTX's loader uses POSIX (dlopen, PATH_MAX), which strict C11 hides. */
#define _GNU_SOURCE
#ifndef PROGRAM
#define PROGRAM "nvtx3"
#endif
#include <cuda_runtime.h>
#ifdef NVTX_V2
#define NVTX_SUPPRESS_V2_DEPRECATION_WARNING 1
#include <nvToolsExt.h>
#else
#include <nvtx3/nvToolsExt.h>
#endif
#include <string.h>

#include "check.h"

enum { N = 64 };

static void check_level(int got, int level, const char *what) {
    if (got != NVTX_NO_PUSH_POP_TRACKING && got != level)
        FAIL("%s returned %d (want %d or NVTX_NO_PUSH_POP_TRACKING)", what, got, level);
}

/* Copies `host` to the device and back, checking the bytes. */
static void round_trip(float *dev, const float *host, float *back) {
    CK_CUDA(cudaMemcpy(dev, host, N * sizeof(float), cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(back, dev, N * sizeof(float), cudaMemcpyDeviceToHost));
    if (memcmp(host, back, N * sizeof(float)) != 0) FAIL("the copy came back changed");
}

int main(void) {
    float host[N], back[N], *dev = NULL;
    /* Before the first CUDA call: no capture yet. */
    nvtxMarkA("warm-up");
    CK_CUDA(cudaMalloc((void **)&dev, N * sizeof(float)));
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    round_trip(dev, host, back);

    nvtxDomainHandle_t domain = nvtxDomainCreateA("ttrace-test");
    nvtxEventAttributes_t attr;
    memset(&attr, 0, sizeof attr);
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = "in-domain";
    /* A range named by a registered string (nvtx3.hpp's registered_string_in, CCCL's names). */
    nvtxEventAttributes_t named = attr;
    named.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    named.message.registered = nvtxDomainRegisterStringA(domain, "registered-name");

    /* What the first push returned: the level with a range-tracking tool, else
     * NVTX_NO_PUSH_POP_TRACKING (which tool answered, for the test). */
    int first = nvtxRangePushA("probe");
    (void)nvtxRangePop();
    printf("%s: first push returned %d\n", PROGRAM, first);

    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < N; i++) host[i] = (float)(step * N + i);
        nvtxRangeId_t started = nvtxRangeStartA("started");
        check_level(nvtxRangePushA("step"), 0, "nvtxRangePushA(step)");
        check_level(nvtxRangePushA("outer"), 1, "nvtxRangePushA(outer)");
        check_level(nvtxRangePushA("inner"), 2, "nvtxRangePushA(inner)");
        round_trip(dev, host, back);
        check_level(nvtxRangePop(), 2, "nvtxRangePop(inner)");
        check_level(nvtxRangePop(), 1, "nvtxRangePop(outer)");
        check_level(nvtxDomainRangePushEx(domain, &attr), 0, "nvtxDomainRangePushEx");
        round_trip(dev, host, back);
        check_level(nvtxDomainRangePushEx(domain, &named), 1, "nvtxDomainRangePushEx(registered)");
        round_trip(dev, host, back);
        check_level(nvtxDomainRangePop(domain), 1, "nvtxDomainRangePop(registered)");
        check_level(nvtxDomainRangePop(domain), 0, "nvtxDomainRangePop");
        check_level(nvtxDomainRangePushEx(domain, &attr), 0, "nvtxDomainRangePushEx(crossed)");
        check_level(nvtxRangePushA("x-crossed"), 1, "nvtxRangePushA(x-crossed)");
        check_level(nvtxDomainRangePop(domain), 0, "nvtxDomainRangePop(crossed)");
        round_trip(dev, host, back);
        check_level(nvtxRangePop(), 1, "nvtxRangePop(x-crossed)");
        nvtxMarkA("after");
        check_level(nvtxRangePop(), 0, "nvtxRangePop(step)");
        nvtxRangeEnd(started);
    }
    nvtxDomainDestroy(domain);
    CK_CUDA(cudaFree(dev));
    printf("%s: OK\n", PROGRAM);
    return 0;
}
