/*
 * An LD_PRELOAD wrapper as PMPI-style NCCL profilers write them: it takes NCCL's own names
 * (ncclAllReduce, ncclGroupStart, ncclGroupEnd), counts the calls and reaches NCCL through
 * its profiling names (pncclAllReduce, ...), which NCCL exports for exactly this. Prints
 * "nccl_pmpi: N calls" when the process exits. Built as a shared library (gcc -shared -fPIC),
 * only against NVIDIA's headers.
 */
#include <nccl.h>

#include <stdio.h>

static int calls;

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    calls++;
    return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    calls++;
    return pncclGroupStart();
}

ncclResult_t ncclGroupEnd(void) {
    calls++;
    return pncclGroupEnd();
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "nccl_pmpi: %d calls\n", calls);
}
