/*
 * A stand-in for a profiler's NVTX tool (what Nsight Systems names in NVTX_INJECTION64_PATH),
 * written against NVTX 3's tool interface only: it takes the core push and pop slots and the
 * domain push and pop slots, returns nesting levels as a range-tracking tool does, and at exit
 * says on stderr how many pushes of each kind it saw.
 */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>

static int depth, domain_depth, pushes, domain_pushes;

static int NVTX_API push_a(const char *message) {
    (void)message;
    pushes++;
    return depth++;
}

static int NVTX_API pop(void) { return depth > 0 ? --depth : -1; }

static int NVTX_API domain_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr) {
    (void)domain;
    (void)attr;
    domain_pushes++;
    return domain_depth++;
}

static int NVTX_API domain_pop(nvtxDomainHandle_t domain) {
    (void)domain;
    return domain_depth > 0 ? --domain_depth : -1;
}

static void report(void) {
    fprintf(stderr, "nvtx_tool: %d pushes, %d domain pushes\n", pushes, domain_pushes);
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    static int once;
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable core = NULL, core2 = NULL;
    unsigned int n = 0, n2 = 0;
    if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &n) ||
        !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &n2))
        return 0;
    *core[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push_a;
    *core[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    *core2[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)domain_push;
    *core2[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)domain_pop;
    if (!once++) atexit(report);
    return 1;
}
