/*
 * tests/integration/c/nvtx3.c against the NVTX v2 library (nvToolsExt.h, libnvToolsExt.so.1)
 * instead of header-only NVTX 3.
 */
#define NVTX_V2 1
#define PROGRAM "nvtx2"
#include "nvtx3.c"
