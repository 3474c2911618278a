/*
 * A continuous-batching loop over libselscan's serving API, in plain C11 against the public header only
 * (docs/serving.md explains every field used here):
 *
 *   1. an earlier request's prompt (a 32-token system prompt) was prefilled with block-wise state caching, so
 *      the state after each of its 16-token blocks sits in a slot of the state pool;
 *   2. one packed prefill call (selscan_fwd with cu_seqlens) runs three requests' prompts of different lengths;
 *      the third shares the system prompt, so it starts at position 32 (context_lens) from the cached block's
 *      slot instead of scanning the prefix again; every block boundary's state is written into the pool;
 *   3. decode steps (selscan_state_update) advance each request by one token per step, the batch padded to a
 *      fixed size with a pad_slot_id entry as a CUDA-graph replay would be; a token that opens a new block
 *      reads the completed block's slot and writes the new block's (dst_state_batch_indices);
 *   4. a self-check: every output equals one plain selscan_fwd over each request's whole token sequence, and
 *      every completed block's slot holds the last_state of a scan truncated at that block.
 *
 * Build and run it against an installed libselscan:
 *   cmake -S examples/serving -B build/serving -DCMAKE_PREFIX_PATH=<prefix> && cmake --build build/serving
 *   ./build/serving/selscan_serving_example
 *
 * It runs on the CPU so it runs everywhere. The same calls run on CUDA with device pointers in every tensor
 * (pool, block table, cu_seqlens, context_lens and slot indices included), exec.device_kind =
 * SELSCAN_DEVICE_CUDA and exec.stream set: the engine keeps its bookkeeping (slot allocation) on the host, copies
 * the tables and indices to the device before each call (docs/serving.md, "Kernels and limits").
 */
#include <selscan/selscan.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The model: one Mamba-1 layer's scan, DIM channels of DSTATE states each. The inputs below stand for what the
 * layer's in_proj and conv1d produce per token; an engine passes those same tensors. */
enum { DIM = 4, DSTATE = 8 };
/* The engine: 16-token blocks, a pool of 16 slots, up to 64 tokens per request and per packed call. */
enum { BLOCK = 16, SLOTS = 16, MAX_TOKENS = 64, MAX_BLOCKS = MAX_TOKENS / BLOCK };
/* Decode: 6 steps of one token, the batch padded to 4 entries (3 requests + 1 padding). */
enum { DECODE_STEPS = 6, DECODE_BATCH = 4, PAD_SLOT = -1 };

/* The self-check's tolerance. The prefill and the decode step compute the scan's recurrence in float32 like the
 * reference scan, but the decode step's loop is a different one (its own exp and sums), so results agree to
 * float32 rounding, not bit for bit. */
#define RTOL 1e-5
#define ATOL 1e-6

/* The scan's inputs for up to MAX_TOKENS tokens, [channel or state][position]: a request's whole history, or
 * the packed prompts of one prefill call. */
typedef struct tokens {
  float u[DIM][MAX_TOKENS], delta[DIM][MAX_TOKENS], z[DIM][MAX_TOKENS];
  float B[DSTATE][MAX_TOKENS], C[DSTATE][MAX_TOKENS];
} tokens;

typedef struct request {
  const char* name;
  int64_t cached; /* tokens whose state is already in the pool (a prefix-cache hit): context_lens */
  int64_t prompt; /* tokens the prefill processes */
  int64_t decode; /* tokens the decode steps add */
  tokens in;      /* the inputs of every token, at its absolute position */
  /* What serving produced for each position (the gated output out_z), checked at the end. */
  float served[DIM][MAX_TOKENS];
} request;

static int64_t total_tokens(const request* r) { return r->cached + r->prompt + r->decode; }

/* Layer weights, shared by every call. */
static float A[DIM][DSTATE], Dskip[DIM], dt_bias[DIM];

/* The engine's state: the pool of recurrent states and each request's block table row (the pool slot of each
 * BLOCK-token block of its history; -1 = no slot yet). Row 0 is the earlier request, rows 1..3 the live ones. */
enum { EARLIER = 0, FIRST_LIVE = 1, NUM_LIVE = 3, NUM_REQUESTS = 4 };
static float pool[SLOTS][DIM][DSTATE];
static int32_t block_table[NUM_REQUESTS][MAX_BLOCKS];
static int32_t next_free_slot = 0;
static request reqs[NUM_REQUESTS];

/* ------------------------------------------------------------------------------------------ small helpers */

/* A tensor descriptor over caller memory; strides are in elements. */
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

/* Every status is checked: on failure, say which call failed and why (the library's message names the argument
 * and the bad value). */
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

static void fill_tokens(tokens* in, int64_t from, int64_t to) {
  for (int64_t t = from; t < to; ++t) {
    for (int d = 0; d < DIM; ++d) {
      in->u[d][t] = uniform(-1, 1);
      in->delta[d][t] = uniform(-1, 1);
      in->z[d][t] = uniform(-1, 1);
    }
    for (int n = 0; n < DSTATE; ++n) {
      in->B[n][t] = uniform(-1, 1);
      in->C[n][t] = uniform(-1, 1);
    }
  }
}

/* Tokens [from, from + count) of src to [at, at + count) of dst. */
static void copy_tokens(tokens* dst, int64_t at, const tokens* src, int64_t from, int64_t count) {
  for (int64_t t = 0; t < count; ++t) {
    for (int d = 0; d < DIM; ++d) {
      dst->u[d][at + t] = src->u[d][from + t];
      dst->delta[d][at + t] = src->delta[d][from + t];
      dst->z[d][at + t] = src->z[d][from + t];
    }
    for (int n = 0; n < DSTATE; ++n) {
      dst->B[n][at + t] = src->B[n][from + t];
      dst->C[n][at + t] = src->C[n][from + t];
    }
  }
}

/* Give every block up to the one holding token `last` a pool slot (blocks already cached keep theirs). */
static void assign_blocks(int32_t* row, int64_t last) {
  for (int64_t j = 0; j <= last / BLOCK; ++j)
    if (row[j] < 0) row[j] = next_free_slot++;
}

static void print_row(const char* name, const int32_t* row) {
  printf("  %-8s block table [", name);
  for (int j = 0; j < MAX_BLOCKS; ++j) printf(j ? " %2d" : "%2d", (int)row[j]);
  printf("]\n");
}

/* The first len positions of `rows` rows of MAX_TOKENS floats, as a (1, rows, len) tensor: the scan's
 * (Bt, D, L) layout with Bt = 1 (and (Bt, N, L) for B and C). */
static selscan_tensor_t by_time(float (*data)[MAX_TOKENS], int64_t rows, int64_t len) {
  return tensor(data, SELSCAN_DTYPE_FLOAT32, 3, SIZES(1, rows, len), SIZES(rows * MAX_TOKENS, MAX_TOKENS, 1));
}

/* The scan's inputs: the first len tokens of `in`; B and C vary per token (Mamba's selection), one group. */
static void set_token_tensors(selscan_fwd_args_t* f, tokens* in, int64_t len) {
  f->u = by_time(in->u, DIM, len);
  f->delta = by_time(in->delta, DIM, len);
  f->z = by_time(in->z, DIM, len);
  f->B = by_time(in->B, DSTATE, len);
  f->C = by_time(in->C, DSTATE, len);
}

/* The weights every call shares: A = -(n+1) (Mamba-1's S4D-real initialisation), D = 1, and a dt bias that puts
 * softplus(delta + dt_bias) around 0.05 .. 0.3. */
static void set_weight_tensors(selscan_tensor_t* a, selscan_tensor_t* skip, selscan_tensor_t* bias) {
  *a = tensor(A, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DIM, DSTATE), SIZES(DSTATE, 1));
  *skip = tensor(Dskip, SELSCAN_DTYPE_FLOAT32, 1, SIZES(DIM), SIZES(1));
  *bias = tensor(dt_bias, SELSCAN_DTYPE_FLOAT32, 1, SIZES(DIM), SIZES(1));
}

/* ------------------------------------------------------------------------------------------------ prefill */

/* One packed prefill of `count` requests starting at reqs[first]: their prompt tokens back to back along time
 * (cu_seqlens), each resuming after its `cached` tokens (context_lens) from the slot of the block holding its
 * last cached token, and writing the state at every block boundary it passes into its block table's slots. */
static int prefill(int first, int count, const selscan_exec_t* exec) {
  static tokens packed;
  static float out[DIM][MAX_TOKENS], out_z[DIM][MAX_TOKENS];
  int32_t cu_seqlens[NUM_REQUESTS + 1], context_lens[NUM_REQUESTS];

  /* Pack: request i's prompt goes to [cu_seqlens[i], cu_seqlens[i+1]). */
  cu_seqlens[0] = 0;
  for (int i = 0; i < count; ++i) {
    request* r = &reqs[first + i];
    copy_tokens(&packed, cu_seqlens[i], &r->in, r->cached, r->prompt);
    cu_seqlens[i + 1] = (int32_t)(cu_seqlens[i] + r->prompt);
    context_lens[i] = (int32_t)r->cached;
    /* Slots for the blocks this call writes: every boundary inside the prompt and the block of its last token. */
    assign_blocks(block_table[first + i], r->cached + r->prompt - 1);
  }
  const int64_t total = cu_seqlens[count];

  selscan_fwd_args_t f = SELSCAN_FWD_ARGS_INIT;
  /* Packed tensors are the dense (Bt, D, L) ones with Bt = 1 and L = all tokens of the call. */
  set_token_tensors(&f, &packed, total);
  set_weight_tensors(&f.A, &f.D, &f.delta_bias);
  f.delta_softplus = 1;
  f.out = by_time(out, DIM, total);
  f.out_z = by_time(out_z, DIM, total);
  /* Serving: count sequences, the pool read and written in place instead of h0 / last_state. */
  f.cu_seqlens = tensor(cu_seqlens, SELSCAN_DTYPE_INT32, 1, SIZES(count + 1), SIZES(1));
  f.ssm_states = tensor(pool, SELSCAN_DTYPE_FLOAT32, 3, SIZES(SLOTS, DIM, DSTATE), SIZES(DIM * DSTATE, DSTATE, 1));
  /* Block-wise state caching: the block table replaces cache_indices; -1 entries (blocks past a sequence's last
   * token) are never read, and pad_slot_id must be set because the INIT macro leaves it 0, a valid slot. */
  f.state_block_size = BLOCK;
  f.block_table = tensor(block_table[first], SELSCAN_DTYPE_INT32, 2, SIZES(count, MAX_BLOCKS), SIZES(MAX_BLOCKS, 1));
  f.context_lens = tensor(context_lens, SELSCAN_DTYPE_INT32, 1, SIZES(count), SIZES(1));
  f.pad_slot_id = PAD_SLOT;
  if (!ok(selscan_fwd(&f, exec), "selscan_fwd (prefill)")) return 0;

  /* Unpack the gated outputs to each request's positions. */
  for (int i = 0; i < count; ++i) {
    request* r = &reqs[first + i];
    for (int64_t t = 0; t < r->prompt; ++t)
      for (int d = 0; d < DIM; ++d) r->served[d][r->cached + t] = out_z[d][cu_seqlens[i] + t];
    printf("  %-8s %2lld tokens at positions %2lld..%2lld%s\n", r->name, (long long)r->prompt,
           (long long)r->cached, (long long)(r->cached + r->prompt - 1),
           r->cached ? " (resumed from the cached prefix)" : "");
  }
  return 1;
}

/* ------------------------------------------------------------------------------------------------- decode */

/* Where request r's token at `pos` reads its state and where it writes the result. The state after pos tokens
 * lives in the slot of the block holding token pos-1. When token pos opens a new block, that block gets a fresh
 * slot: the step reads the completed block's slot and writes the new one (dst_state_batch_indices), so the
 * completed block keeps its final state for prefix caching without a copy. Otherwise both are the same slot. */
static void decode_slots(int32_t* row, int64_t pos, int32_t* src, int32_t* dst) {
  const int64_t block = pos / BLOCK;
  if (row[block] < 0) {
    assign_blocks(row, pos);
    printf("  token %lld opens block %lld: state read from slot %d, written to slot %d\n", (long long)pos,
           (long long)block, (int)row[block - 1], (int)row[block]);
  }
  *src = row[(pos - 1) / BLOCK];
  *dst = row[block];
}

/* One decode step: every live request's next token, plus padding up to DECODE_BATCH entries. */
static int decode_step(int step, const selscan_exec_t* exec) {
  float x[DECODE_BATCH][DIM] = {{0}}, dt[DECODE_BATCH][DIM] = {{0}}, z[DECODE_BATCH][DIM] = {{0}};
  float B[DECODE_BATCH][DSTATE] = {{0}}, C[DECODE_BATCH][DSTATE] = {{0}}, out[DECODE_BATCH][DIM];
  int32_t slots[DECODE_BATCH], dst_slots[DECODE_BATCH];

  /* Gather each request's token into its batch entry; the rest of the batch is padding (no slot). */
  for (int e = 0; e < DECODE_BATCH; ++e) {
    slots[e] = dst_slots[e] = PAD_SLOT;
    if (e >= NUM_LIVE) continue;
    request* r = &reqs[FIRST_LIVE + e];
    const int64_t pos = r->cached + r->prompt + step;
    decode_slots(block_table[FIRST_LIVE + e], pos, &slots[e], &dst_slots[e]);
    for (int d = 0; d < DIM; ++d) {
      x[e][d] = r->in.u[d][pos];
      dt[e][d] = r->in.delta[d][pos];
      z[e][d] = r->in.z[d][pos];
    }
    for (int n = 0; n < DSTATE; ++n) {
      B[e][n] = r->in.B[n][pos];
      C[e][n] = r->in.C[n][pos];
    }
  }
  memset(out, 0x7f, sizeof out); /* garbage, to show the padding entry's output is written (as 0) */

  selscan_state_update_args_t a = SELSCAN_STATE_UPDATE_ARGS_INIT;
  /* The Mamba-1 form: state (S, D, N) and x, dt, z, out (Bt, D); B and C (Bt, N), one group. */
  a.x = tensor(x, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  a.dt = tensor(dt, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  a.z = tensor(z, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  a.B = tensor(B, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DSTATE), SIZES(DSTATE, 1));
  a.C = tensor(C, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DSTATE), SIZES(DSTATE, 1));
  set_weight_tensors(&a.A, &a.D, &a.dt_bias); /* the prefill's weights: the same layer */
  a.dt_softplus = 1;
  /* The same pool the prefill wrote; each entry names its slot, -1 marks the padding entry. */
  a.state = tensor(pool, SELSCAN_DTYPE_FLOAT32, 3, SIZES(SLOTS, DIM, DSTATE), SIZES(DIM * DSTATE, DSTATE, 1));
  a.state_batch_indices = tensor(slots, SELSCAN_DTYPE_INT32, 1, SIZES(DECODE_BATCH), SIZES(1));
  /* Where each updated state goes: the same slot, or the new block's when the token opens one. */
  a.dst_state_batch_indices = tensor(dst_slots, SELSCAN_DTYPE_INT32, 1, SIZES(DECODE_BATCH), SIZES(1));
  a.pad_slot_id = PAD_SLOT; /* already -1 from the INIT macro; set anyway, as an engine should */
  a.out = tensor(out, SELSCAN_DTYPE_FLOAT32, 2, SIZES(DECODE_BATCH, DIM), SIZES(DIM, 1));
  if (!ok(selscan_state_update(&a, exec), "selscan_state_update (decode)")) return 0;

  printf("  step %d: slots read [", step);
  for (int e = 0; e < DECODE_BATCH; ++e) printf(e ? " %2d" : "%2d", (int)slots[e]);
  printf("], written [");
  for (int e = 0; e < DECODE_BATCH; ++e) printf(e ? " %2d" : "%2d", (int)dst_slots[e]);
  printf("]\n");
  for (int e = 0; e < NUM_LIVE; ++e) {
    request* r = &reqs[FIRST_LIVE + e];
    for (int d = 0; d < DIM; ++d) r->served[d][r->cached + r->prompt + step] = out[e][d];
  }
  /* A padding entry reads and writes no slot and gets out = 0. */
  for (int e = NUM_LIVE; e < DECODE_BATCH; ++e)
    for (int d = 0; d < DIM; ++d)
      if (out[e][d] != 0.0f) {
        fprintf(stderr, "padding entry %d: out[%d] = %g, expected 0\n", e, d, out[e][d]);
        return 0;
      }
  return 1;
}

/* ------------------------------------------------------------------------------------------- self-check */

/* A plain (non-serving) scan of request r's first `len` tokens from a zero state: its gated outputs and the
 * state after token len-1. */
static int reference_scan(request* r, int64_t len, float out_z[DIM][MAX_TOKENS], float last[DIM][DSTATE],
                          const selscan_exec_t* exec) {
  static float out[DIM][MAX_TOKENS];
  selscan_fwd_args_t f = SELSCAN_FWD_ARGS_INIT;
  set_token_tensors(&f, &r->in, len);
  set_weight_tensors(&f.A, &f.D, &f.delta_bias);
  f.delta_softplus = 1;
  f.out = by_time(out, DIM, len);
  f.out_z = by_time(out_z, DIM, len);
  f.last_state = tensor(last, SELSCAN_DTYPE_FLOAT32, 3, SIZES(1, DIM, DSTATE), SIZES(DIM * DSTATE, DSTATE, 1));
  return ok(selscan_fwd(&f, exec), "selscan_fwd (reference)");
}

/* Compare n floats; returns the number outside the tolerance and raises *max_err to the largest |got - want|. */
static int compare(const float* got, const float* want, int64_t n, double* max_err) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = fabs((double)got[i] - (double)want[i]);
    if (err > *max_err) *max_err = err;
    if (!(err <= ATOL + RTOL * fabs((double)want[i]))) ++bad;
  }
  return bad;
}

/* Request r's served outputs against one scan of all its tokens, and every block slot it owns against a scan
 * truncated at that block's end (its last, possibly partial, block against the full scan's last_state). */
static int check_request(request* r, const int32_t* row, double* out_err, double* state_err,
                         const selscan_exec_t* exec, int* bad) {
  static float ref_out_z[DIM][MAX_TOKENS], ref_last[DIM][DSTATE], scratch[DIM][MAX_TOKENS];
  const int64_t total = total_tokens(r);
  if (!reference_scan(r, total, ref_out_z, ref_last, exec)) return 0;
  for (int d = 0; d < DIM; ++d)
    *bad += compare(&r->served[d][r->cached], &ref_out_z[d][r->cached], total - r->cached, out_err);

  for (int64_t j = 0; j <= (total - 1) / BLOCK; ++j) {
    const int64_t end = (j + 1) * BLOCK < total ? (j + 1) * BLOCK : total;
    if (!reference_scan(r, end, scratch, ref_last, exec)) return 0;
    *bad += compare(&pool[row[j]][0][0], &ref_last[0][0], DIM * DSTATE, state_err);
  }
  return 1;
}

/* --------------------------------------------------------------------------------------------------- main */

/* Serve the requests and check the results; 1 when everything matched. */
static int serve_and_check(const selscan_exec_t* exec) {
  for (int d = 0; d < DIM; ++d) {
    for (int n = 0; n < DSTATE; ++n) A[d][n] = -(float)(n + 1);
    Dskip[d] = 1.0f;
    dt_bias[d] = uniform(-2.5f, -1.5f);
  }
  for (int i = 0; i < NUM_REQUESTS; ++i)
    for (int j = 0; j < MAX_BLOCKS; ++j) block_table[i][j] = -1;

  /* The earlier request: a 32-token system prompt, prefilled and finished; its two full blocks stay cached. */
  request* earlier = &reqs[EARLIER];
  *earlier = (request){.name = "earlier", .cached = 0, .prompt = 2 * BLOCK, .decode = 0};
  fill_tokens(&earlier->in, 0, total_tokens(earlier));
  /* The live requests: two new prompts (37 and 9 tokens) and one (12 tokens) after the same system prompt. */
  const int64_t prompts[NUM_LIVE] = {37, 9, 12};
  const char* names[NUM_LIVE] = {"req0", "req1", "req2"};
  for (int i = 0; i < NUM_LIVE; ++i)
    reqs[FIRST_LIVE + i] = (request){.name = names[i], .cached = 0, .prompt = prompts[i], .decode = DECODE_STEPS};
  request* hit = &reqs[FIRST_LIVE + 2];
  hit->cached = earlier->prompt;
  copy_tokens(&hit->in, 0, &earlier->in, 0, hit->cached);
  for (int i = 0; i < NUM_LIVE; ++i) {
    request* r = &reqs[FIRST_LIVE + i];
    fill_tokens(&r->in, r->cached, total_tokens(r));
  }

  printf("model: D = %d channels, N = %d states; engine: %d-token blocks, a pool of %d slots\n", DIM, DSTATE, BLOCK,
         SLOTS);
  printf("earlier prefill (the system prompt):\n");
  if (!prefill(EARLIER, 1, exec)) return 0;
  print_row(earlier->name, block_table[EARLIER]);

  /* Prefix-cache lookup: req2's first 32 tokens match the earlier request's two full blocks, so its block table
   * starts with their slots; it only reads them (its first write is block 2). */
  block_table[FIRST_LIVE + 2][0] = block_table[EARLIER][0];
  block_table[FIRST_LIVE + 2][1] = block_table[EARLIER][1];

  printf("packed prefill of %d requests:\n", NUM_LIVE);
  if (!prefill(FIRST_LIVE, NUM_LIVE, exec)) return 0;
  for (int i = 0; i < NUM_LIVE; ++i) print_row(reqs[FIRST_LIVE + i].name, block_table[FIRST_LIVE + i]);

  printf("decode, %d requests padded to a batch of %d (slot %d = padding):\n", NUM_LIVE, DECODE_BATCH, PAD_SLOT);
  for (int step = 0; step < DECODE_STEPS; ++step)
    if (!decode_step(step, exec)) return 0;
  for (int i = 0; i < NUM_LIVE; ++i) print_row(reqs[FIRST_LIVE + i].name, block_table[FIRST_LIVE + i]);

  printf("self-check against one plain scan per request (tolerance |err| <= %g + %g |ref|):\n", ATOL, RTOL);
  int bad = 0;
  for (int i = 0; i < NUM_REQUESTS; ++i) {
    const request* r = &reqs[i];
    double out_err = 0, state_err = 0;
    if (!check_request(&reqs[i], block_table[i], &out_err, &state_err, exec, &bad)) return 0;
    printf("  %-8s outputs at %2lld..%2lld max |err| %.2e; %lld block states max |err| %.2e\n", r->name,
           (long long)r->cached, (long long)(total_tokens(r) - 1), out_err,
           (long long)((total_tokens(r) - 1) / BLOCK + 1), state_err);
  }
  if (bad) printf("%d values outside the tolerance\n", bad);
  return bad == 0;
}

int main(void) {
  selscan_exec_t exec = SELSCAN_EXEC_INIT; /* CPU, all hardware threads; needs no workspace here */

  printf("libselscan %s: %s\n", selscan_version_string(), selscan_build_info());
  if (selscan_version() != SELSCAN_VERSION) {
    fprintf(stderr, "header %d but library %d\n", SELSCAN_VERSION, (int)selscan_version());
    printf("FAIL\n");
    return 1;
  }
  const int pass = serve_and_check(&exec);
  printf(pass ? "PASS\n" : "FAIL\n");
  return pass ? 0 : 1;
}
