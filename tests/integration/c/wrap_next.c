/*
 * An LD_PRELOAD wrapper as profilers write them: cudaMemcpy counted, then chained to the next
 * definition, found with dlsym(RTLD_NEXT, "cudaMemcpy"). RTLD_NEXT means "after the object
 * that calls dlsym": a dlsym that lost track of its caller would hand this wrapper itself (or
 * skip a library), and the chain would recurse or break. Aborts when the next definition is
 * missing or is this wrapper; prints "wrap_next: N calls chained" when the process exits.
 * Built as a shared library (gcc -shared -fPIC), only against NVIDIA's headers.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static int calls;

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    static __typeof__(&cudaMemcpy) next;
    if (!next) next = (__typeof__(&cudaMemcpy))dlsym(RTLD_NEXT, "cudaMemcpy");
    if (!next || next == cudaMemcpy) {
        fprintf(stderr, "wrap_next: dlsym(RTLD_NEXT) gave %s\n", next ? "this wrapper" : "nothing");
        abort();
    }
    calls++;
    return next(dst, src, count, kind);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "wrap_next: %d calls chained\n", calls);
}
