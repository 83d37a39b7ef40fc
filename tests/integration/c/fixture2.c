/*
 * fixture2: a second training fixture, written in C against NVIDIA's headers only and built
 * unlike the Rust trainer (tests/trainer), so that compare and check are not tuned to one
 * program's conventions. See docs/fixture2.md for its conventions and bug catalogue.
 *
 * The model: a two-layer MLP with a tanh between, tensor parallel Megatron-style (fc1 column
 * parallel, fc2 row parallel with a sum all-reduce of its partial outputs) and data parallel
 * (each replica takes a contiguous slice of the batch), trained with plain SGD on a summed
 * squared-error loss:
 *   z1 = W1 x          fc1, cublasGemmEx, W1 stored transposed (D x H), op T
 *   a1 = tanh(z1)      host
 *   y  = W2 a1         fc2, cublasLtMatmul, op N N, then ncclAllReduce(sum) over TP
 *   dy = y - t         host (loss = 1/2 sum (y - t)^2: a sum over the batch, not a mean)
 *   dW2 = dy a1^T      cublasLtMatmul, op N T
 *   da1 = W2^T dy      cublasGemmEx, op T N
 *   dz1 = da1 (1-a1^2) host
 *   dW1^T = x dz1^T    cublasGemmEx, op N T
 *   g = ncclAllReduce(dW, ncclAvg) over DP, then g /= local batch on the host (sum then
 *   divide: with ncclAvg over dp replicas that is the gradient of the global mean), and
 *   W -= lr g on the host, in f32 master weights, copied back to the device.
 * Activations live column-major with the batch along columns; one micro-batch per step; every
 * element-wise operation runs on the host (D2H copy, compute, H2D copy) since the simulator
 * runs no kernels.
 *
 * Usage: fixture2 [--precision fp32|bf16] [--tp N] [--dp N] [--steps N] [--bug NAME]
 * Ranks come from RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (simrun or
 * torchrun); WORLD_SIZE must equal tp * dp; global rank = dp_index * tp + tp_index.
 * Prints "fixture2: rank R step S loss L" per step and "fixture2: rank R of W OK" at the end.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define NVTX_SUPPRESS_V2_DEPRECATION_WARNING 1

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvToolsExt.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM "fixture2"
#include "check.h"

/* ---- the bug catalogue ----------------------------------------------------------------------- */

enum Bug {
    BUG_NONE,
    BUG_TP_ALLREDUCE_MISSING, /* fc2's partial outputs are used unreduced (every rank) */
    BUG_TP_ALLREDUCE_AVG,     /* fc2's partial outputs reduced with ncclAvg, a sum is due */
    BUG_NEIGHBOUR_SHARD,      /* global rank 1 loads its TP neighbour's W1 shard */
    BUG_GRAD_DIVIDED_TWICE,   /* the host divides the gradients by the local batch twice */
    BUG_REPLICA_DRIFT,        /* DP replica 1 applies a learning rate 1% larger */
    BUG_WRONG_TRANSPOSE,      /* the last rank's fc1 forward reads W1 without its transpose */
    BUG_DP_SUM,               /* the DP gradient reduction sums where ncclAvg is due */
    BUG_COUNT
};

static const char *const BUG_NAMES[BUG_COUNT] = {
    "none",           "tp-allreduce-missing", "tp-allreduce-avg", "neighbour-shard",
    "grad-divided-twice", "replica-drift",    "wrong-transpose",  "dp-sum",
};

/* ---- configuration --------------------------------------------------------------------------- */

enum { D = 32, H = 64, O = 16, B = 16 }; /* input, hidden, output widths; global batch */

typedef struct {
    int bf16; /* 0: f32 everywhere; 1: bf16 tensors, f32 compute and host masters */
    int tp, dp, steps;
    int init_copies; /* extra uploads of W1 before the first step (a framework's set-up) */
    enum Bug bug;
    int rank, world, t, d; /* global rank, world, TP index, DP index */
    int hl, bl;            /* hidden columns and batch columns of this rank */
} Config;

static void usage(void) {
    fprintf(stderr, "usage: fixture2 [--precision fp32|bf16] [--tp N] [--dp N] [--steps N] [--init-copies N] [--bug NAME]\n"
                    "bugs:");
    for (int b = 0; b < BUG_COUNT; b++) fprintf(stderr, " %s", BUG_NAMES[b]);
    fprintf(stderr, "\n");
    exit(2);
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static Config parse(int argc, char **argv) {
    Config c = {.bf16 = 0, .tp = 1, .dp = 1, .steps = 3, .bug = BUG_NONE};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--list-bugs")) {
            for (int b = 1; b < BUG_COUNT; b++) printf("%s\n", BUG_NAMES[b]);
            exit(0);
        }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--precision")) {
            if (!strcmp(v, "fp32")) c.bf16 = 0;
            else if (!strcmp(v, "bf16")) c.bf16 = 1;
            else usage();
        } else if (!strcmp(a, "--tp")) c.tp = atoi(v);
        else if (!strcmp(a, "--dp")) c.dp = atoi(v);
        else if (!strcmp(a, "--steps")) c.steps = atoi(v);
        else if (!strcmp(a, "--init-copies")) c.init_copies = atoi(v);
        else if (!strcmp(a, "--bug")) {
            int found = -1;
            for (int b = 0; b < BUG_COUNT; b++)
                if (!strcmp(v, BUG_NAMES[b])) found = b;
            if (found < 0) usage();
            c.bug = (enum Bug)found;
        } else usage();
    }
    c.rank = env_int("RANK", 0);
    c.world = env_int("WORLD_SIZE", 1);
    if (c.tp < 1 || c.dp < 1 || H % c.tp || B % c.dp || c.steps < 1) usage();
    if (c.world != c.tp * c.dp) FAIL("WORLD_SIZE %d is not tp %d x dp %d", c.world, c.tp, c.dp);
    c.t = c.rank % c.tp;
    c.d = c.rank / c.tp;
    c.hl = H / c.tp;
    c.bl = B / c.dp;
    return c;
}

/* ---- host numbers ------------------------------------------------------------------------------ */

static uint16_t to_bf16(float f) { /* round to nearest even; inputs here are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A deterministic value in [-1, 1) from three integers (splitmix64). */
static float noise(uint64_t a, uint64_t b, uint64_t c) {
    uint64_t z = a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull + c * 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* ---- device transfers through a pinned staging buffer ----------------------------------------- */

typedef struct {
    const Config *cfg;
    cudaStream_t stream;
    void *stage; /* pinned, large enough for any tensor */
    size_t esz;  /* element size of device tensors */
} Io;

/* Device tensor (n elements of the working type) -> host floats. */
static void download(Io *io, const void *dev, float *host, size_t n) {
    CK_CUDA(cudaMemcpyAsync(io->stage, dev, n * io->esz, cudaMemcpyDeviceToHost, io->stream));
    CK_CUDA(cudaStreamSynchronize(io->stream));
    for (size_t i = 0; i < n; i++)
        host[i] = io->cfg->bf16 ? from_bf16(((uint16_t *)io->stage)[i]) : ((float *)io->stage)[i];
}

/* Host floats -> device tensor of the working type (rounded to bf16 in bf16 mode). */
static void upload(Io *io, const float *host, void *dev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (io->cfg->bf16) ((uint16_t *)io->stage)[i] = to_bf16(host[i]);
        else ((float *)io->stage)[i] = host[i];
    }
    CK_CUDA(cudaMemcpyAsync(dev, io->stage, n * io->esz, cudaMemcpyHostToDevice, io->stream));
    CK_CUDA(cudaStreamSynchronize(io->stream));
}

/* ---- GEMMs ---------------------------------------------------------------------------------- */

typedef struct {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cudaStream_t stream;
    cudaDataType dt;
    void *ws;
    size_t ws_size;
} Gemms;

/* cublasGemmEx, column-major, f32 compute, alpha 1, beta 0. */
static void gemm_ex(Gemms *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const void *a, int lda, const void *b, int ldb, void *c, int ldc) {
    const float alpha = 1.0f, beta = 0.0f;
    CK_CUBLAS(cublasGemmEx(g->blas, ta, tb, m, n, k, &alpha, a, g->dt, lda, b, g->dt, ldb, &beta, c,
                           g->dt, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* cublasLtMatmul D = op(A) op(B), C = D (beta 0), f32 compute. */
static void gemm_lt(Gemms *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const void *a, int lda, const void *b, int ldb, void *d, int ldd) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    CK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&la, g->dt, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, g->dt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    CK_CUBLAS(cublasLtMatrixLayoutCreate(&ld, g->dt, m, n, ldd));
    CK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &g->ws_size, sizeof g->ws_size));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    CK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(g->lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found < 1) FAIL("cublasLtMatmulAlgoGetHeuristic found no algorithm");
    const float alpha = 1.0f, beta = 0.0f;
    CK_CUBLAS(cublasLtMatmul(g->lt, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heur.algo, g->ws,
                             g->ws_size, g->stream));
    CK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(la));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(lb));
    CK_CUBLAS(cublasLtMatrixLayoutDestroy(ld));
    CK_CUBLAS(cublasLtMatmulDescDestroy(op));
}

/* ---- communicators ----------------------------------------------------------------------------- */

typedef struct {
    ncclComm_t world, tp, dp; /* tp / dp are NULL when that dimension is 1 */
} Comms;

static Comms make_comms(const Config *c) {
    Comms k = {NULL, NULL, NULL};
    if (c->world == 1) return k;
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (!addr || !port) FAIL("MASTER_ADDR and MASTER_PORT must be set with WORLD_SIZE > 1");
    char comm_id[256];
    snprintf(comm_id, sizeof comm_id, "%s:%s", addr, port);
    if (setenv("NCCL_COMM_ID", comm_id, 1) != 0) FAIL("setenv NCCL_COMM_ID");
    ncclUniqueId id;
    CK_NCCL(ncclGetUniqueId(&id));
    CK_NCCL(ncclCommInitRank(&k.world, c->world, id, c->rank));
    /* Both splits are collective over the world: every rank makes them, in this order. */
    ncclComm_t tp = NULL, dp = NULL;
    CK_NCCL(ncclCommSplit(k.world, c->d, c->t, &tp, NULL));
    CK_NCCL(ncclCommSplit(k.world, c->t, c->d, &dp, NULL));
    k.tp = c->tp > 1 ? tp : NULL;
    k.dp = c->dp > 1 ? dp : NULL;
    return k;
}

/* ---- the model ---------------------------------------------------------------------------------- */

typedef struct {
    /* device tensors (working type), column-major */
    void *w1t; /* D x hl, ld D: this rank's columns of W1^T */
    void *w2;  /* O x hl, ld O: this rank's columns of W2 */
    void *x;   /* D x bl: this replica's batch */
    void *z1, *a1, *dz1, *da1; /* hl x bl */
    void *y2, *y, *dy;         /* O x bl: fc2's partial output, its sum over TP, dL/dy */
    void *dw2, *gw2;           /* O x hl: local gradient, reduced over DP */
    void *dw1t, *gw1t;         /* D x hl */
    /* host f32 master weights and scratch */
    float *m_w1t, *m_w2, *h_x, *h_t, *h_z1, *h_a1, *h_y, *h_d, *h_g1, *h_g2;
} Model;

static void *dalloc(size_t n, size_t esz) {
    void *p = NULL;
    CK_CUDA(cudaMalloc(&p, n * esz));
    return p;
}

static float *halloc(size_t n) {
    float *p = calloc(n, sizeof(float));
    if (!p) FAIL("out of host memory");
    return p;
}

/* Global W1 (H x D) and W2 (O x H) from a fixed seed; every rank draws the same matrices and
 * keeps its columns of W1^T (hidden units) and of W2. */
static void init_weights(const Config *c, Model *m) {
    int shard = c->t;
    if (c->bug == BUG_NEIGHBOUR_SHARD && c->rank == 1) shard = (c->t + 1) % c->tp;
    for (int h = 0; h < c->hl; h++) {
        int gh = shard * c->hl + h;
        for (int i = 0; i < D; i++) m->m_w1t[i + h * D] = noise(1, (uint64_t)gh, (uint64_t)i) / sqrtf((float)D);
        for (int o = 0; o < O; o++) m->m_w2[o + h * O] = noise(2, (uint64_t)o, (uint64_t)(c->t * c->hl + h)) / sqrtf((float)H);
    }
}

/* Step s's inputs and targets for this replica: global batch columns [d*bl, (d+1)*bl). */
static void make_batch(const Config *c, Model *m, int s) {
    for (int b = 0; b < c->bl; b++) {
        int gb = c->d * c->bl + b;
        for (int i = 0; i < D; i++) m->h_x[i + b * D] = noise(3 + (uint64_t)s, (uint64_t)gb, (uint64_t)i);
        for (int o = 0; o < O; o++) m->h_t[o + b * O] = 0.5f * noise(1000 + (uint64_t)s, (uint64_t)gb, (uint64_t)o);
    }
}

static Model alloc_model(const Config *c, size_t esz) {
    Model m;
    size_t hl = (size_t)c->hl, bl = (size_t)c->bl;
    m.w1t = dalloc(D * hl, esz);
    m.w2 = dalloc(O * hl, esz);
    m.x = dalloc(D * bl, esz);
    m.z1 = dalloc(hl * bl, esz);
    m.a1 = dalloc(hl * bl, esz);
    m.dz1 = dalloc(hl * bl, esz);
    m.da1 = dalloc(hl * bl, esz);
    m.y2 = dalloc(O * bl, esz);
    m.y = c->tp > 1 ? dalloc(O * bl, esz) : m.y2;
    m.dy = dalloc(O * bl, esz);
    m.dw2 = dalloc(O * hl, esz);
    m.gw2 = c->dp > 1 ? dalloc(O * hl, esz) : m.dw2;
    m.dw1t = dalloc(D * hl, esz);
    m.gw1t = c->dp > 1 ? dalloc(D * hl, esz) : m.dw1t;
    m.m_w1t = halloc(D * hl);
    m.m_w2 = halloc(O * hl);
    m.h_x = halloc(D * bl);
    m.h_t = halloc(O * bl);
    m.h_z1 = halloc(hl * bl);
    m.h_a1 = halloc(hl * bl);
    m.h_y = halloc(O * bl);
    m.h_d = halloc(hl * bl > O * bl ? hl * bl : O * bl);
    m.h_g1 = halloc(D * hl);
    m.h_g2 = halloc(O * hl);
    return m;
}

/* Forward: fc1 (cuBLAS), tanh on the host, fc2 (cuBLASLt) and its TP reduction. */
static void forward(const Config *c, Gemms *g, Io *io, const Comms *k, Model *m) {
    int hl = c->hl, bl = c->bl;
    nvtxRangePushA("forward.fc1");
    cublasOperation_t ta = CUBLAS_OP_T;
    if (c->bug == BUG_WRONG_TRANSPOSE && c->rank == c->world - 1) ta = CUBLAS_OP_N; /* D == hl */
    gemm_ex(g, ta, CUBLAS_OP_N, hl, bl, D, m->w1t, D, m->x, D, m->z1, hl);
    download(io, m->z1, m->h_z1, (size_t)hl * bl);
    for (int i = 0; i < hl * bl; i++) m->h_a1[i] = tanhf(m->h_z1[i]);
    upload(io, m->h_a1, m->a1, (size_t)hl * bl);
    if (c->bf16) /* the backward uses the activation as the device holds it */
        for (int i = 0; i < hl * bl; i++) m->h_a1[i] = from_bf16(to_bf16(m->h_a1[i]));
    nvtxRangePop();

    nvtxRangePushA("forward.fc2");
    gemm_lt(g, CUBLAS_OP_N, CUBLAS_OP_N, O, bl, hl, m->w2, O, m->a1, hl, m->y2, O);
    if (k->tp && c->bug != BUG_TP_ALLREDUCE_MISSING) {
        ncclRedOp_t op = c->bug == BUG_TP_ALLREDUCE_AVG ? ncclAvg : ncclSum;
        CK_NCCL(ncclAllReduce(m->y2, m->y, (size_t)O * bl, c->bf16 ? ncclBfloat16 : ncclFloat32, op, k->tp,
                              io->stream));
    } else if (k->tp) {
        CK_CUDA(cudaMemcpyAsync(m->y, m->y2, (size_t)O * bl * io->esz, cudaMemcpyDeviceToDevice, io->stream));
    }
    nvtxRangePop();
}

/* Loss and backward; returns this replica's summed loss. */
static double backward(const Config *c, Gemms *g, Io *io, Model *m) {
    int hl = c->hl, bl = c->bl;
    nvtxRangePushA("loss");
    download(io, m->y, m->h_y, (size_t)O * bl);
    double loss = 0;
    for (int i = 0; i < O * bl; i++) {
        float e = m->h_y[i] - m->h_t[i];
        loss += 0.5 * (double)e * e;
        m->h_d[i] = e;
    }
    upload(io, m->h_d, m->dy, (size_t)O * bl);
    nvtxRangePop();

    nvtxRangePushA("backward.fc2");
    gemm_lt(g, CUBLAS_OP_N, CUBLAS_OP_T, O, hl, bl, m->dy, O, m->a1, hl, m->dw2, O);
    gemm_ex(g, CUBLAS_OP_T, CUBLAS_OP_N, hl, bl, O, m->w2, O, m->dy, O, m->da1, hl);
    nvtxRangePop();

    nvtxRangePushA("backward.fc1");
    download(io, m->da1, m->h_d, (size_t)hl * bl);
    for (int i = 0; i < hl * bl; i++) m->h_d[i] *= 1.0f - m->h_a1[i] * m->h_a1[i];
    upload(io, m->h_d, m->dz1, (size_t)hl * bl);
    gemm_ex(g, CUBLAS_OP_N, CUBLAS_OP_T, D, hl, bl, m->x, D, m->dz1, hl, m->dw1t, D);
    nvtxRangePop();
    return loss;
}

/* DP gradient reduction (ncclAvg), then sum-then-divide and SGD on the host masters. */
static void update(const Config *c, Io *io, const Comms *k, Model *m) {
    size_t n1 = (size_t)D * c->hl, n2 = (size_t)O * c->hl;
    nvtxRangePushA("optimizer");
    if (k->dp) {
        ncclRedOp_t op = c->bug == BUG_DP_SUM ? ncclSum : ncclAvg;
        ncclDataType_t t = c->bf16 ? ncclBfloat16 : ncclFloat32;
        CK_NCCL(ncclAllReduce(m->dw2, m->gw2, n2, t, op, k->dp, io->stream));
        CK_NCCL(ncclAllReduce(m->dw1t, m->gw1t, n1, t, op, k->dp, io->stream));
    }
    download(io, m->gw1t, m->h_g1, n1);
    download(io, m->gw2, m->h_g2, n2);
    float div = (float)c->bl;
    if (c->bug == BUG_GRAD_DIVIDED_TWICE) div *= (float)c->bl;
    float lr = 0.05f;
    if (c->bug == BUG_REPLICA_DRIFT && c->d == 1) lr *= 1.01f;
    for (size_t i = 0; i < n1; i++) m->m_w1t[i] -= lr * (m->h_g1[i] / div);
    for (size_t i = 0; i < n2; i++) m->m_w2[i] -= lr * (m->h_g2[i] / div);
    upload(io, m->m_w1t, m->w1t, n1);
    upload(io, m->m_w2, m->w2, n2);
    nvtxRangePop();
}

int main(int argc, char **argv) {
    Config c = parse(argc, argv);
    g_rank = c.rank;
    int devices = 0;
    CK_CUDA(cudaGetDeviceCount(&devices));
    if (devices < 1) FAIL("no CUDA device");
    CK_CUDA(cudaSetDevice(env_int("LOCAL_RANK", 0) % devices));
    Comms k = make_comms(&c);

    Io io = {.cfg = &c, .esz = c.bf16 ? 2 : 4};
    CK_CUDA(cudaStreamCreateWithFlags(&io.stream, cudaStreamNonBlocking));
    CK_CUDA(cudaMallocHost(&io.stage, sizeof(float) * D * H * 2));
    Gemms g = {.stream = io.stream, .dt = c.bf16 ? CUDA_R_16BF : CUDA_R_32F, .ws_size = 1u << 20};
    CK_CUBLAS(cublasCreate(&g.blas));
    CK_CUBLAS(cublasSetStream(g.blas, io.stream));
    CK_CUBLAS(cublasLtCreate(&g.lt));
    CK_CUDA(cudaMalloc(&g.ws, g.ws_size));

    Model m = alloc_model(&c, io.esz);
    init_weights(&c, &m);
    for (int i = 0; i < c.init_copies; i++) upload(&io, m.m_w1t, m.w1t, (size_t)D * c.hl);
    upload(&io, m.m_w1t, m.w1t, (size_t)D * c.hl);
    upload(&io, m.m_w2, m.w2, (size_t)O * c.hl);
    for (int s = 0; s < c.steps; s++) {
        make_batch(&c, &m, s);
        upload(&io, m.h_x, m.x, (size_t)D * c.bl);
        forward(&c, &g, &io, &k, &m);
        double loss = backward(&c, &g, &io, &m);
        update(&c, &io, &k, &m);
        printf("fixture2: rank %d step %d loss %.6f\n", c.rank, s, loss);
    }
    CK_CUDA(cudaStreamSynchronize(io.stream));
    if (k.world) CK_NCCL(ncclCommDestroy(k.world));
    printf("fixture2: rank %d of %d OK\n", c.rank, c.world);
    return 0;
}
