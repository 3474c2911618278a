/*
 * The causal depthwise convolution of a Mamba block (causal-conv1d's semantics; include/selscan/selscan.h section
 * 5c) the way a server runs it, in plain C11 against the public header only:
 *
 *   1. prefill: one selscan_conv1d_fwd over SEQS prompts of PROMPT tokens (bias, SiLU; x channel-last, the layout
 *      Mamba-2's in_proj leaves it in). final_states, each prompt's last W-1 inputs, is written straight into the
 *      sequences' slots 1..SEQS of a conv-state pool: a strided view of the pool is all final_states needs;
 *   2. decode: DECODE_STEPS calls of selscan_conv1d_update, one token per sequence each, from those slots. The
 *      batch lists the sequences in another order than the prefill and is padded to DECODE_BATCH entries with a
 *      pad_slot_id entry, as a CUDA-graph replay of a fixed batch size would be; conv_state_indices names the slots;
 *   3. a self-check against a float64 convolution written below: every output, prefill and decode, equals the
 *      convolution of its sequence's whole token history; each slot ends holding its sequence's last W-1 inputs,
 *      bit for bit; the padding entry's outputs are 0; the slots no sequence uses are untouched.
 *
 * Build and run it against an installed libselscan:
 *   cmake -S examples/conv1d -B build/conv1d -DCMAKE_PREFIX_PATH=<prefix> && cmake --build build/conv1d
 *   ./build/conv1d/selscan_conv1d_example
 *
 * It runs on the CPU, and then on CUDA device 0 when the example was built with the CUDA runtime (its CMake
 * project links it where it finds a CUDA toolkit: SELSCAN_EXAMPLE_CUDA) and the library serves that device. The
 * calls are the same on both; only where the tensors live differs (the `memory` table below).
 */
#include <selscan/selscan.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SELSCAN_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The layer: DIM channels, a width-W filter per channel (Mamba's d_conv = 4), a bias and SiLU. */
enum { DIM = 16, W = 4, STATE_LEN = W - 1 };
/* The engine: SEQS sequences prefilled together, then DECODE_STEPS tokens each; a pool of SLOTS conv states,
 * sequence s in slot FIRST_SLOT + s; decode batches padded to DECODE_BATCH entries. */
enum { SEQS = 3, PROMPT = 13, DECODE_STEPS = 5, TOTAL = PROMPT + DECODE_STEPS };
enum { SLOTS = 5, FIRST_SLOT = 1, DECODE_BATCH = 4, PAD_SLOT = -1 };
/* The decode batch: entry i serves sequence decode_seq[i] (-1: padding). */
static const int decode_seq[DECODE_BATCH] = {2, -1, 0, 1};

/* The self-check's tolerance: the library computes in float32 (a few products and a sum, then SiLU). */
#define RTOL 1e-5
#define ATOL 1e-5
/* What the slots no sequence uses hold before and must hold after. */
#define UNUSED_SLOT_VALUE 42.0f

/* Host data: the layer's weights, every sequence's token history [seq][time][channel], what serving produced. */
static float weight[DIM][W], bias[DIM];
static float history[SEQS][TOTAL][DIM];
static float served[SEQS][TOTAL][DIM];

/* ------------------------------------------------------------------------------------------ memory */

/* Where the tensors live: host memory for the CPU, device memory for CUDA. */
typedef struct memory {
  const char* name;
  selscan_exec_t exec;
  void* (*alloc)(size_t bytes);
  int (*put)(void* dst, const void* src, size_t bytes); /* host -> where the library reads */
  int (*get)(void* dst, const void* src, size_t bytes); /* where the library wrote -> host */
  int (*sync)(void);                                    /* wait for the calls enqueued so far */
  void (*release)(void* p);
} memory;

static void* host_alloc(size_t bytes) { return malloc(bytes); }
static int host_copy(void* dst, const void* src, size_t bytes) {
  memcpy(dst, src, bytes);
  return 1;
}
static int host_sync(void) { return 1; }
static void host_release(void* p) { free(p); }

#ifdef SELSCAN_EXAMPLE_CUDA
static int cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return 1;
  fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return 0;
}
static void* cuda_alloc(size_t bytes) {
  void* p = NULL;
  return cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc") ? p : NULL;
}
static int cuda_put(void* dst, const void* src, size_t bytes) {
  return cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
static int cuda_get(void* dst, const void* src, size_t bytes) {
  return cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
static int cuda_sync(void) { return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
static void cuda_release(void* p) { cudaFree(p); }
#endif

/* ------------------------------------------------------------------------------------------ small helpers */

static selscan_tensor_t tensor(void* data, selscan_dtype_t dtype, int ndim, const int64_t* sizes,
                               const int64_t* strides) {
  selscan_tensor_t t = SELSCAN_TENSOR_INIT;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    t.sizes[i] = sizes[i];
    t.strides[i] = strides[i];
  }
  return t;
}
#define SIZES(...) ((const int64_t[]){__VA_ARGS__})

/* Every status is checked: on failure, say which call failed and why (the message names the argument). */
static int ok(selscan_status_t st, const char* what) {
  if (st == SELSCAN_STATUS_SUCCESS) return 1;
  fprintf(stderr, "%s failed: %s: %s\n", what, selscan_status_string(st), selscan_last_error());
  return 0;
}

/* Deterministic inputs without depending on the C library's rand(). */
static uint64_t rng_state = 0x853c49e6748fea9bULL;
static float uniform(float lo, float hi) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

/* ------------------------------------------------------------------------------------------ serving */

/* The device-side tensors of one run. */
typedef struct buffers {
  float *weight, *bias;
  float* prompt_x;   /* (SEQS, DIM, PROMPT) channel-last: [seq][time][channel] */
  float* prompt_out; /* likewise */
  float* pool;       /* (SLOTS, DIM, STATE_LEN): [slot][channel][column] */
  float *step_x, *step_out; /* (DECODE_BATCH, DIM) */
  int32_t* indices;  /* (DECODE_BATCH,) */
} buffers;

static selscan_tensor_t weight_tensor(buffers* b) {
  return tensor(b->weight, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DIM, W), SIZES(W, 1));
}
static selscan_tensor_t bias_tensor(buffers* b) {
  return tensor(b->bias, SELSCAN_DTYPE_FLOAT32, 1, SIZES(DIM), SIZES(1));
}

/* Step 1: the prompts through one forward; their last W-1 inputs land in slots FIRST_SLOT.. of the pool. */
static int prefill(const memory* m, buffers* b) {
  static float x[SEQS][PROMPT][DIM], out[SEQS][PROMPT][DIM];
  for (int s = 0; s < SEQS; ++s) memcpy(x[s], history[s], sizeof x[s]);
  if (!m->put(b->prompt_x, x, sizeof x)) return 0;

  /* (Bt, D, L) with stride 1 over D: element [s][d][t] at s*PROMPT*DIM + t*DIM + d. */
  const int64_t* cl = SIZES(PROMPT * DIM, 1, DIM);
  selscan_conv1d_fwd_args_t a = SELSCAN_CONV1D_FWD_ARGS_INIT;
  a.x = tensor(b->prompt_x, SELSCAN_DTYPE_FLOAT32, 3, SIZES(SEQS, DIM, PROMPT), cl);
  a.weight = weight_tensor(b);
  a.bias = bias_tensor(b);
  a.activation = SELSCAN_ACTIVATION_SILU;
  a.out = tensor(b->prompt_out, SELSCAN_DTYPE_FLOAT32, 3, SIZES(SEQS, DIM, PROMPT), cl);
  /* (Bt, D, W-1) over the pool's slots FIRST_SLOT.. FIRST_SLOT+SEQS-1: the pool's own strides. */
  a.final_states = tensor(b->pool + (size_t)FIRST_SLOT * DIM * STATE_LEN, SELSCAN_DTYPE_FLOAT32, 3,
                          SIZES(SEQS, DIM, STATE_LEN), SIZES(DIM * STATE_LEN, STATE_LEN, 1));
  if (!ok(selscan_conv1d_fwd(&a, &m->exec), "selscan_conv1d_fwd (prefill)")) return 0;
  if (!m->sync() || !m->get(out, b->prompt_out, sizeof out)) return 0;
  for (int s = 0; s < SEQS; ++s) memcpy(served[s], out[s], sizeof out[s]);
  return 1;
}

/* Step 2: one token per sequence from its slot; returns 0 on a failed call or a padding entry's nonzero out. */
static int decode_step(const memory* m, buffers* b, int step) {
  static float x[DECODE_BATCH][DIM], out[DECODE_BATCH][DIM];
  int32_t idx[DECODE_BATCH];
  const int t = PROMPT + step;
  for (int i = 0; i < DECODE_BATCH; ++i) {
    const int s = decode_seq[i];
    idx[i] = s < 0 ? PAD_SLOT : FIRST_SLOT + s;
    for (int d = 0; d < DIM; ++d) x[i][d] = s < 0 ? 7.0f : history[s][t][d]; /* padding: stale data, unread */
  }
  if (!m->put(b->step_x, x, sizeof x) || !m->put(b->indices, idx, sizeof idx)) return 0;

  selscan_conv1d_update_args_t a = SELSCAN_CONV1D_UPDATE_ARGS_INIT; /* pad_slot_id -1 */
  a.x = tensor(b->step_x, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  a.weight = weight_tensor(b);
  a.bias = bias_tensor(b);
  a.conv_state_indices = tensor(b->indices, SELSCAN_DTYPE_INT32, 1, SIZES(DECODE_BATCH), SIZES(1));
  a.pad_slot_id = PAD_SLOT;
  a.activation = SELSCAN_ACTIVATION_SILU;
  a.conv_state = tensor(b->pool, SELSCAN_DTYPE_FLOAT32, 3, SIZES(SLOTS, DIM, STATE_LEN),
                        SIZES(DIM * STATE_LEN, STATE_LEN, 1));
  a.out = tensor(b->step_out, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  if (!ok(selscan_conv1d_update(&a, &m->exec), "selscan_conv1d_update")) return 0;
  if (!m->sync() || !m->get(out, b->step_out, sizeof out)) return 0;
  for (int i = 0; i < DECODE_BATCH; ++i) {
    const int s = decode_seq[i];
    for (int d = 0; d < DIM; ++d) {
      if (s >= 0) {
        served[s][t][d] = out[i][d];
      } else if (out[i][d] != 0.0f) {
        fprintf(stderr, "decode step %d: the padding entry's out[%d] is %g, not 0\n", step, d, (double)out[i][d]);
        return 0;
      }
    }
  }
  return 1;
}

/* ------------------------------------------------------------------------------------------ self-check */

/* out of sequence s at time t in float64: bias + sum_k w[k] x(t - (W-1) + k), x = 0 before the sequence, SiLU. */
static double reference(int s, int t, int d) {
  double y = bias[d];
  for (int k = 0; k < W; ++k) {
    const int src = t - (W - 1) + k;
    if (src >= 0) y += (double)weight[d][k] * (double)history[s][src][d];
  }
  return y / (1.0 + exp(-y));
}

static int check(const float pool[SLOTS][DIM][STATE_LEN]) {
  int bad = 0;
  double worst = 0;
  for (int s = 0; s < SEQS; ++s)
    for (int t = 0; t < TOTAL; ++t)
      for (int d = 0; d < DIM; ++d) {
        const double ref = reference(s, t, d), err = fabs((double)served[s][t][d] - ref);
        if (err > worst || err != err) worst = err;
        if (!(err <= ATOL + RTOL * fabs(ref))) {
          if (bad++ < 5)
            fprintf(stderr, "sequence %d, token %d, channel %d: got %.8g, reference %.8g\n", s, t, d,
                    (double)served[s][t][d], ref);
        }
      }
  printf("  outputs: %d tokens x %d channels, max |err| %.3g vs float64 (tolerance %g + %g |ref|)\n", SEQS * TOTAL,
         DIM, worst, ATOL, RTOL);
  int bad_slots = 0;
  for (int slot = 0; slot < SLOTS; ++slot) {
    const int s = slot - FIRST_SLOT;
    for (int d = 0; d < DIM; ++d)
      for (int j = 0; j < STATE_LEN; ++j) {
        const float want = (s >= 0 && s < SEQS) ? history[s][TOTAL - STATE_LEN + j][d] : UNUSED_SLOT_VALUE;
        if (memcmp(&pool[slot][d][j], &want, sizeof want) != 0) {
          if (bad_slots++ < 5)
            fprintf(stderr, "slot %d, channel %d, column %d: %g, expected %g\n", slot, d, j,
                    (double)pool[slot][d][j], (double)want);
        }
      }
  }
  printf("  pool: every sequence's slot holds its last %d inputs, the other slots are untouched: %s\n", STATE_LEN,
         bad_slots ? "no" : "yes");
  return bad == 0 && bad_slots == 0;
}

/* Serve the sequences on `m` and check them: 1 when everything matched. */
static int run(const memory* m) {
  static float pool[SLOTS][DIM][STATE_LEN];
  for (int slot = 0; slot < SLOTS; ++slot)
    for (int d = 0; d < DIM; ++d)
      for (int j = 0; j < STATE_LEN; ++j) pool[slot][d][j] = UNUSED_SLOT_VALUE;
  memset(served, 0xff, sizeof served); /* NaN until served */

  buffers b;
  b.weight = m->alloc(sizeof weight);
  b.bias = m->alloc(sizeof bias);
  b.prompt_x = m->alloc(sizeof(float) * SEQS * PROMPT * DIM);
  b.prompt_out = m->alloc(sizeof(float) * SEQS * PROMPT * DIM);
  b.pool = m->alloc(sizeof pool);
  b.step_x = m->alloc(sizeof(float) * DECODE_BATCH * DIM);
  b.step_out = m->alloc(sizeof(float) * DECODE_BATCH * DIM);
  b.indices = m->alloc(sizeof(int32_t) * DECODE_BATCH);
  void* all[] = {b.weight, b.bias, b.prompt_x, b.prompt_out, b.pool, b.step_x, b.step_out, b.indices};
  int pass = 1;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) pass = pass && all[i] != NULL;
  pass = pass && m->put(b.weight, weight, sizeof weight) && m->put(b.bias, bias, sizeof bias) &&
         m->put(b.pool, pool, sizeof pool);

  pass = pass && prefill(m, &b);
  for (int step = 0; pass && step < DECODE_STEPS; ++step) pass = decode_step(m, &b, step);
  pass = pass && m->get(pool, b.pool, sizeof pool);
  if (pass) {
    printf("%s: prefill of %d x %d tokens, %d decode steps of a %d-entry batch (one padding entry)\n", m->name, SEQS,
           PROMPT, DECODE_STEPS, DECODE_BATCH);
    pass = check((const float(*)[DIM][STATE_LEN])pool);
  }
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i] != NULL) m->release(all[i]);
  return pass;
}

int main(void) {
  printf("libselscan %s: %s\n", selscan_version_string(), selscan_build_info());
  if (selscan_version() != SELSCAN_VERSION) {
    fprintf(stderr, "header %d but library %d\n", SELSCAN_VERSION, (int)selscan_version());
    printf("FAIL\n");
    return 1;
  }
  for (int d = 0; d < DIM; ++d) {
    for (int k = 0; k < W; ++k) weight[d][k] = uniform(-0.5f, 0.5f);
    bias[d] = uniform(-0.5f, 0.5f);
  }
  for (int s = 0; s < SEQS; ++s)
    for (int t = 0; t < TOTAL; ++t)
      for (int d = 0; d < DIM; ++d) history[s][t][d] = uniform(-1, 1);

  const memory cpu = {"CPU", SELSCAN_EXEC_INIT, host_alloc, host_copy, host_copy, host_sync, host_release};
  int pass = run(&cpu);

#ifdef SELSCAN_EXAMPLE_CUDA
  int32_t devices = 0;
  if (selscan_cuda_device_count(&devices) != SELSCAN_STATUS_SUCCESS || devices == 0) {
    printf("CUDA: skipped (no device, or the library was built without CUDA)\n");
  } else if (selscan_check_device(0) != SELSCAN_STATUS_SUCCESS) {
    printf("CUDA: skipped (%s)\n", selscan_last_error());
  } else if (!cuda_ok(cudaSetDevice(0), "cudaSetDevice")) {
    pass = 0;
  } else {
    memory gpu = {"CUDA device 0", SELSCAN_EXEC_INIT, cuda_alloc, cuda_put, cuda_get, cuda_sync, cuda_release};
    gpu.exec.device_kind = SELSCAN_DEVICE_CUDA; /* device 0, the legacy default stream: cudaMemcpy orders after */
    pass = run(&gpu) && pass;
  }
#else
  printf("CUDA: not built into this example (its CMake project links the CUDA runtime where it finds a toolkit)\n");
#endif
  printf(pass ? "PASS\n" : "FAIL\n");
  return pass ? 0 : 1;
}
