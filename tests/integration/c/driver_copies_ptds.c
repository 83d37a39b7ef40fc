/*
 * driver_copies.c built as a program built with per-thread default streams is
 * (`nvcc --default-stream per-thread` defines CUDA_API_PER_THREAD_DEFAULT_STREAM): cuda.h then
 * names the synchronous copies and memsets `..._ptds` (on the calling thread's default
 * stream) and the asynchronous ones `..._ptsz`, and the lookups ask the driver for those
 * spellings. Same modes and output as driver_copies.c (linked, proc, entry, entry_version
 * reach the per-thread spellings; dlsym and proc_v1 name their functions themselves).
 */
#define _GNU_SOURCE
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#include "driver_copies.c"
