/*
 * A C program written only against NVIDIA's headers that moves tensors with the driver API,
 * as JAX's XLA plugin does. argv[1] says how it finds the driver's entry points: "linked" (as
 * the program links them), "dlsym" (libcuda.so.1 dlopened without RTLD_GLOBAL, every entry
 * point taken with dlsym(handle, name), as XLA does), "proc" (cuGetProcAddress of the base
 * name, as NVIDIA's Python bindings do), "proc_v1" (the CUDA 11 cuGetProcAddress, itself found
 * with dlsym), "entry" (the runtime's cudaGetDriverEntryPoint) or "entry_version"
 * (cudaGetDriverEntryPointByVersion). The runtime only initialises the device and makes the
 * stream (prints "driver_copies: stream 0x...").
 *
 * On that stream and the legacy one: cuMemcpyHtoD_v2 of 64 floats (host_a), cuMemcpyHtoDAsync_v2
 * (host_b), cuMemcpyDtoDAsync_v2 of it, cuMemsetD32Async to 0 of 64 words then of 1.0f over
 * 16, cuMemcpyDtoHAsync_v2 of the device-to-device copy, cuMemcpyDtoH_v2 of the first buffer,
 * cuMemcpy (unified addressing) of it into a fifth buffer and cuMemsetD8_v2 of 0x11 over its
 * first 8 bytes, and cuMemsetD2D8Async of 0x22 over two rows of 16 bytes, 64 apart (not captured:
 * a gap). Every byte read back is checked. Prints "driver_copies: OK"; exit status 1 on
 * a failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT */
#endif
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* cudaGetDriverEntryPoint is deprecated from CUDA 12.5 on, and still exported: its one use
 * is exempt from -Werror. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static cudaError_t (*const ENTRY_POINT)(const char *, void **, unsigned long long,
                                        enum cudaDriverEntryPointQueryResult *) =
    &cudaGetDriverEntryPoint;
#pragma GCC diagnostic pop

#define PROGRAM "driver_copies"
#include "check.h"

#define N 64
#define CU(call)                                                  \
    do {                                                          \
        CUresult r_ = (call);                                     \
        if (r_ != CUDA_SUCCESS) FAIL("%s: CUresult %d", #call, (int)r_); \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) FAIL("usage: driver_copies linked|dlsym|proc|proc_v1|entry|entry_version");
    const char *mode = argv[1];
    int by_dlsym = strcmp(mode, "dlsym") == 0;
    /* By the names cuda.h gives: cuMemcpyHtoD is cuMemcpyHtoD_v2, or cuMemcpyHtoD_v2_ptds in
     * a build with per-thread default streams (driver_copies_ptds.c). */
    __typeof__(&cuMemAlloc) alloc = &cuMemAlloc;
    __typeof__(&cuMemcpyHtoD) htod = &cuMemcpyHtoD;
    __typeof__(&cuMemcpyDtoH) dtoh = &cuMemcpyDtoH;
    __typeof__(&cuMemcpy) copy = &cuMemcpy;
    __typeof__(&cuMemcpyHtoDAsync) htod_async = &cuMemcpyHtoDAsync;
    __typeof__(&cuMemcpyDtoHAsync) dtoh_async = &cuMemcpyDtoHAsync;
    __typeof__(&cuMemcpyDtoDAsync) dtod_async = &cuMemcpyDtoDAsync;
    __typeof__(&cuMemsetD32Async) set32_async = &cuMemsetD32Async;
    __typeof__(&cuMemsetD8) set8 = &cuMemsetD8;
    __typeof__(&cuMemsetD2D8Async) set2d_async = &cuMemsetD2D8Async;
    if (by_dlsym) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) FAIL("dlopen libcuda.so.1: %s", dlerror());
#define TAKE(var, name)                                    \
    do {                                                   \
        *(void **)&var = dlsym(h, name);                   \
        if (!var) FAIL("dlsym %s: %s", name, dlerror());   \
    } while (0)
        TAKE(alloc, "cuMemAlloc_v2");
        TAKE(htod, "cuMemcpyHtoD_v2");
        TAKE(dtoh, "cuMemcpyDtoH_v2");
        TAKE(copy, "cuMemcpy");
        TAKE(htod_async, "cuMemcpyHtoDAsync_v2");
        TAKE(dtoh_async, "cuMemcpyDtoHAsync_v2");
        TAKE(dtod_async, "cuMemcpyDtoDAsync_v2");
        TAKE(set32_async, "cuMemsetD32Async");
        TAKE(set8, "cuMemsetD8_v2");
        TAKE(set2d_async, "cuMemsetD2D8Async");
    } else if (strcmp(mode, "linked") != 0) {
        /* By base name, as the driver documents: the version is picked by cudaVersion. */
        typedef CUresult (*proc_v1_t)(const char *, void **, int, cuuint64_t);
        proc_v1_t proc_v1 = NULL;
        if (strcmp(mode, "proc_v1") == 0) {
            *(void **)&proc_v1 = dlsym(RTLD_DEFAULT, "cuGetProcAddress");
            if (!proc_v1) FAIL("dlsym cuGetProcAddress: %s", dlerror());
        }
#define FIND(var, name)                                                                    \
    do {                                                                                   \
        void *fn_ = NULL;                                                                  \
        if (strcmp(mode, "proc") == 0) {                                                   \
            CUdriverProcAddressQueryResult st_;                                            \
            CU(cuGetProcAddress(name, &fn_, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st_)); \
            if (st_ != CU_GET_PROC_ADDRESS_SUCCESS) FAIL("%s: status %d", name, (int)st_);    \
        } else if (strcmp(mode, "proc_v1") == 0) {                                         \
            CU(proc_v1(name, &fn_, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT));            \
        } else if (strcmp(mode, "entry_version") == 0) {                                   \
            enum cudaDriverEntryPointQueryResult st_;                                      \
            CK_CUDA(cudaGetDriverEntryPointByVersion(name, &fn_, CUDA_VERSION,             \
                                                     cudaEnableDefault, &st_));            \
            if (st_ != cudaDriverEntryPointSuccess) FAIL("%s: status %d", name, (int)st_);  \
        } else if (strcmp(mode, "entry") == 0) {                                           \
            enum cudaDriverEntryPointQueryResult st_;                                      \
            CK_CUDA(ENTRY_POINT(name, &fn_, cudaEnableDefault, &st_));                     \
            if (st_ != cudaDriverEntryPointSuccess) FAIL("%s: status %d", name, (int)st_);  \
        } else {                                                                           \
            FAIL("unknown mode %s", mode);                                                 \
        }                                                                                  \
        if (!fn_) FAIL("%s: not found", name);                                             \
        *(void **)&var = fn_;                                                              \
    } while (0)
        FIND(alloc, "cuMemAlloc");
        FIND(htod, "cuMemcpyHtoD");
        FIND(dtoh, "cuMemcpyDtoH");
        FIND(copy, "cuMemcpy");
        FIND(htod_async, "cuMemcpyHtoDAsync");
        FIND(dtoh_async, "cuMemcpyDtoHAsync");
        FIND(dtod_async, "cuMemcpyDtoDAsync");
        FIND(set32_async, "cuMemsetD32Async");
        FIND(set8, "cuMemsetD8");
        FIND(set2d_async, "cuMemsetD2D8Async");
    }

    CK_CUDA(cudaFree(0));
    cudaStream_t rs;
    CK_CUDA(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
    CUstream s = (CUstream)rs;
    printf("driver_copies: stream %p\n", (void *)s);

    float host_a[N], host_b[N], back[N], words[N];
    for (int i = 0; i < N; i++) {
        host_a[i] = (float)i * 0.25f;
        host_b[i] = 100.0f - (float)i;
    }
    CUdeviceptr d[5];
    for (int i = 0; i < 5; i++) CU(alloc(&d[i], sizeof host_a));
    CU(htod(d[0], host_a, sizeof host_a));
    CU(htod_async(d[1], host_b, sizeof host_b, s));
    CU(dtod_async(d[2], d[1], sizeof host_b, s));
    CU(set32_async(d[3], 0, N, s));
    CU(set32_async(d[3], 0x3f800000u, 16, s));
    CU(dtoh_async(back, d[2], sizeof back, s));
    CK_CUDA(cudaStreamSynchronize(rs));
    for (int i = 0; i < N; i++)
        if (back[i] != host_b[i]) FAIL("device-to-device: %d: %g", i, (double)back[i]);
    CU(dtoh(words, d[3], sizeof words));
    for (int i = 0; i < N; i++)
        if (words[i] != (i < 16 ? 1.0f : 0.0f)) FAIL("memset D32: %d: %g", i, (double)words[i]);
    CU(dtoh(back, d[0], sizeof back));
    for (int i = 0; i < N; i++)
        if (back[i] != host_a[i]) FAIL("upload: %d: %g", i, (double)back[i]);
    CU(copy(d[4], d[0], sizeof host_a));
    CU(set8(d[4], 0x11, 8));
    unsigned char bytes[sizeof host_a];
    CU(dtoh(bytes, d[4], sizeof bytes));
    for (size_t i = 0; i < sizeof bytes; i++) {
        unsigned char want = i < 8 ? 0x11 : ((unsigned char *)host_a)[i];
        if (bytes[i] != want) FAIL("unified copy + memset D8: byte %zu", i);
    }
    CU(set2d_async(d[2], 64, 0x22, 16, 2, s));
    CK_CUDA(cudaStreamSynchronize(rs));
    unsigned char rows[128];
    CU(dtoh(rows, d[2], sizeof rows));
    for (size_t i = 0; i < sizeof rows; i++) {
        unsigned char want = (i % 64) < 16 ? 0x22 : ((unsigned char *)host_b)[i];
        if (rows[i] != want) FAIL("memset D2D8: byte %zu", i);
    }
    CK_CUDA(cudaStreamDestroy(rs));
    printf("driver_copies: OK\n");
    return 0;
}
