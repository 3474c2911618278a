/*
 * libselscan: the Mamba selective scan (S6) as a standalone library with a plain C ABI.
 *
 * This header is the whole public interface. Read it top to bottom:
 *   1. versions and export macro
 *   2. status codes
 *   3. dtypes, devices and the tensor descriptor
 *   4. the execution context (device, stream, workspace)
 *   5. forward and backward argument structs
 *   5b. the decode step: its argument struct and entry point (selscan_state_update)
 *   5c. the causal depthwise convolution (causal-conv1d): forward, backward, decode update
 *   6. entry points
 *
 * Conventions
 *   - Every entry point returns a selscan_status_t and never throws, aborts or exits. On failure a detailed,
 *     thread-local message naming the argument and the expected vs actual value is available from
 *     selscan_last_error() until the next failing call on the same thread.
 *   - Argument structs start with `struct_size`; set it to sizeof(the struct) (the SELSCAN_*_INIT macros do).
 *     Versions only append fields at the end of a struct. A library newer than the caller treats the fields
 *     past the caller's struct_size as zero / absent; a library older than the caller accepts the caller's
 *     newer fields only while they are all zero (else UNSUPPORTED: a request for something it cannot do).
 *     Reserved fields must be 0.
 *   - Sizes and strides are int64 and counted in elements of the tensor's own dtype (complex64 elements for
 *     complex tensors; real elements for the interleaved (Bt, G, N, 2L) complex B/C).
 *   - An optional tensor is absent when its data pointer is NULL.
 *   - Outputs own their memory: no output may share a byte with any other tensor of the call (input or output;
 *     the in-place arguments are selscan_state_update's state and the forward's state pool, ssm_states, each
 *     counting as an output here), and no two elements of one output may share a byte (BAD_LAYOUT).
 *   - No hidden device allocation and no device synchronisation: GPU calls only enqueue work on the given
 *     stream (plus cudaMemsetAsync into the caller's outputs/workspace), so they can be captured in CUDA graphs.
 *     See docs/abi.md for the full reference (layouts, numerics, thread-safety).
 */
#ifndef SELSCAN_SELSCAN_H
#define SELSCAN_SELSCAN_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------------------------- 1 */
#define SELSCAN_VERSION_MAJOR 0
#define SELSCAN_VERSION_MINOR 5
#define SELSCAN_VERSION_PATCH 0
#define SELSCAN_VERSION (SELSCAN_VERSION_MAJOR * 10000 + SELSCAN_VERSION_MINOR * 100 + SELSCAN_VERSION_PATCH)
#define SELSCAN_VERSION_STRING "0.5.0" /* the three numbers above, as selscan_version_string() returns them */

#if defined(_WIN32)
#  if defined(SELSCAN_BUILDING_LIBRARY)
#    define SELSCAN_API __declspec(dllexport)
#  elif defined(SELSCAN_STATIC)
#    define SELSCAN_API
#  else
#    define SELSCAN_API __declspec(dllimport)
#  endif
#else
#  define SELSCAN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- 2 */
typedef enum selscan_status_t {
  SELSCAN_STATUS_SUCCESS = 0,
  SELSCAN_STATUS_INVALID_ARGUMENT = 1,    /* a NULL required pointer, a bad enum or flag value */
  SELSCAN_STATUS_BAD_STRUCT_SIZE = 2,     /* struct_size below the first version of the struct, or above 64 KiB */
  SELSCAN_STATUS_SHAPE_MISMATCH = 3,      /* ndim or a size disagrees with the problem, or a size is < 1 */
  SELSCAN_STATUS_DTYPE_MISMATCH = 4,      /* a tensor's dtype is not the one required */
  SELSCAN_STATUS_BAD_LAYOUT = 5,          /* a stride, alignment or overlap the library does not support */
  SELSCAN_STATUS_UNSUPPORTED = 6,         /* valid in principle, not supported (dstate > 256, a newer field) */
  SELSCAN_STATUS_WORKSPACE_TOO_SMALL = 7, /* workspace_bytes below what selscan_*_workspace_size reported */
  SELSCAN_STATUS_CUDA_NOT_BUILT = 8,      /* a CUDA call into a library built without CUDA */
  SELSCAN_STATUS_NO_DEVICE = 9,           /* no driver, no such device index */
  SELSCAN_STATUS_ARCH_MISMATCH = 10,      /* the device's compute capability is not served by this build */
  SELSCAN_STATUS_CUDA_ERROR = 11,         /* the CUDA runtime reported an error (message has the details) */
  SELSCAN_STATUS_OUT_OF_MEMORY = 12,      /* host memory for the CPU path could not be allocated */
  SELSCAN_STATUS_INTERNAL = 13,           /* a bug: please report it with selscan_last_error() */
  /* Not a status: the number of statuses this header knows. A newer library may return values >= this one;
   * treat them as errors (selscan_status_string() still names them). */
  SELSCAN_STATUS_COUNT
} selscan_status_t;

/* ---------------------------------------------------------------------------------------------- 3 */
typedef enum selscan_dtype_t {
  SELSCAN_DTYPE_FLOAT32 = 0,
  SELSCAN_DTYPE_FLOAT16 = 1,  /* IEEE binary16 */
  SELSCAN_DTYPE_BFLOAT16 = 2,
  SELSCAN_DTYPE_COMPLEX64 = 3, /* two float32: real, imaginary */
  SELSCAN_DTYPE_INT32 = 4,     /* index tensors only (state_batch_indices, cu_seqlens, cache_indices, ...) */
  SELSCAN_DTYPE_INT64 = 5,     /* index tensors only */
  SELSCAN_DTYPE_BOOL = 6       /* one byte, 0 = false (has_initial_state) */
} selscan_dtype_t;

typedef enum selscan_device_kind_t {
  SELSCAN_DEVICE_CPU = 0,
  SELSCAN_DEVICE_CUDA = 1
} selscan_device_kind_t;

#define SELSCAN_MAX_NDIM 4
#define SELSCAN_MAX_DSTATE 256
#define SELSCAN_CHUNK 2048 /* chunk length of the saved chunk states x: nc = ceil(L / 2048) */

/* A strided view of caller-owned memory. sizes/strides beyond ndim are ignored. */
typedef struct selscan_tensor_t {
  void* data;                        /* NULL = absent (optional tensors only) */
  int32_t dtype;                     /* selscan_dtype_t */
  int32_t ndim;
  int64_t sizes[SELSCAN_MAX_NDIM];
  int64_t strides[SELSCAN_MAX_NDIM]; /* in elements; >= 0 */
} selscan_tensor_t;

/* An absent tensor (all zero), for building the argument structs' initialisers. */
#define SELSCAN_TENSOR_INIT {NULL, 0, 0, {0, 0, 0, 0}, {0, 0, 0, 0}}

/* ---------------------------------------------------------------------------------------------- 4 */
typedef struct selscan_exec_t {
  size_t struct_size;       /* sizeof(selscan_exec_t) */
  int32_t device_kind;      /* selscan_device_kind_t */
  int32_t device_index;     /* CUDA device ordinal (the device that owns the tensors); ignored on CPU */
  void* stream;             /* cudaStream_t; NULL = the legacy default stream; ignored on CPU */
  void* workspace;          /* caller-owned scratch on that device (may be NULL when the size query says 0);
                               aligned to SELSCAN_WORKSPACE_ALIGNMENT bytes whenever workspace_bytes > 0 */
  size_t workspace_bytes;
  int32_t num_threads;      /* CPU path: worker threads; 0 = all hardware threads */
  int32_t reserved;         /* must be 0 */
} selscan_exec_t;

/* Alignment the workspace pointer must have (cudaMalloc and the framework allocators give at least this). */
#define SELSCAN_WORKSPACE_ALIGNMENT 256

#define SELSCAN_EXEC_INIT {sizeof(selscan_exec_t), SELSCAN_DEVICE_CPU, 0, NULL, NULL, 0, 0, 0}

/* ---------------------------------------------------------------------------------------------- 5 */
/*
 * Shapes (Bt = batch, D = dim, L = seqlen, N = dstate, G = groups, nc = ceil(L/2048)):
 *   itype = FLOAT32 | FLOAT16 | BFLOAT16 (u's dtype); wtype = FLOAT32 | COMPLEX64 (A's dtype)
 *   u, delta, z, out, out_z, dout, du, ddelta, dz   (Bt, D, L)   itype, last stride 1 (or L == 1)
 *   A                                                (D, N)      wtype, any strides
 *   B, C constant                                    (D, N)      wtype, any strides
 *   B, C variable  (real wtype)                      (Bt, G, N, L)  or (Bt, N, L) meaning G = 1;  itype
 *                  (complex wtype)                   (Bt, G, N, 2L), Re/Im interleaved along the last dim
 *                  last stride 1; G divides D; channel d uses group d / (D / G); B and C share G
 *   D, delta_bias, dD, ddelta_bias                   (D,)        FLOAT32
 *   h0, last_state, dh0                              (Bt, D, N)  wtype, any strides
 *   x (chunk states)                                 (Bt, D, nc, 2N) wtype, contiguous
 *   dA, constant dB/dC                               like A / B / C;  variable dB/dC like B/C (itype)
 * The math is upstream selective_scan_cuda's (docs/numerics.md). x[b,d,c,2n] = running product of the decay,
 * x[b,d,c,2n+1] = scanned state after chunk c. As upstream, when B is constant (and h0 is absent) the scanned
 * state excludes the factor B[d,n]; last_state is always the true state h.
 *
 * Serving (since 0.3; docs/serving.md). Fields appended to both structs; with all of them absent/0 a call is
 * exactly the one above.
 *   cu_seqlens (Bt+1,) INT32 or INT64: Bt sequences packed along time. u, delta, z, out, out_z, dout, du,
 *     ddelta, dz are (1, D, total_L) and variable B/C, dB/dC (1, G, N, total_L) (2*total_L complex); sequence b
 *     is time [cu[b], cu[b+1]) and is scanned on its own from its initial state. h0, last_state, dh0 stay
 *     (Bt, D, N), one row per sequence. Sequences may be empty. Contract: cu[0] = 0, non-decreasing,
 *     cu[Bt] = total_L (checked for CPU calls; on CUDA the offsets are read on the device only, clamped into
 *     [0, total_L] so no access leaves the tensors, and bad offsets give undefined values). x becomes
 *     (1, D, total_L / 2048 + Bt, 2N): chunk c of sequence b is at floor(cu[b] / 2048) + b + c.
 *   ssm_states (S, D, N) wtype, read and written in place (forward only): sequence b starts from slot
 *     cache_indices[b] (slot b without cache_indices, then S must be Bt) and its final state is written back
 *     into that slot. Not with h0 or last_state. Slots no sequence names are untouched; two sequences naming
 *     one slot leave it undefined.
 *   cache_indices (Bt,) INT32 or INT64, with pad_slot_id: an entry equal to pad_slot_id marks a padding
 *     sequence: its out/out_z (and last_state rows) are written 0, no slot is read or written, and in the
 *     backward all its gradients are 0 and it adds nothing to dA, dB, dC, dD, ddelta_bias. Other entries must
 *     lie in [0, S) (checked for CPU calls; on CUDA an entry outside is written NaN and touches no slot).
 *     The SELSCAN_*_INIT macros leave pad_slot_id 0 like every field after 0.2: set it with cache_indices
 *     (upstream and vLLM use -1).
 *   has_initial_state (Bt,) BOOL or INT32, with h0 or ssm_states: 0 starts sequence b from zero (its h0 row or
 *     slot is not read; its dh0 row is 0). Absent: every sequence starts from its h0 row or slot.
 * Any serving field turns the fold_B convention off (x holds the true state). The backward of a call with
 * ssm_states takes the states it started from as h0 (gathered before the forward overwrote them) and the same
 * cu_seqlens / cache_indices / has_initial_state / pad_slot_id; dh0 (Bt, D, N) is per sequence.
 *
 * Block-wise state caching (since 0.4, forward only; vLLM's prefix caching for Mamba): with
 * state_block_size K > 0 every sequence keeps one pool slot per K-token block of its whole history instead of one
 * slot, so a later request sharing a K-aligned prefix can resume from the state at the end of that prefix.
 *   block_table (Bt, M) INT32 or INT64, any strides: entry [b][j] is the slot of block j of sequence b, block j
 *     being its absolute token positions [jK, (j+1)K). Needs ssm_states; cache_indices must be absent.
 *   context_lens (Bt,) INT32 or INT64, optional: c_b >= 0, the tokens of sequence b processed by earlier calls
 *     (the absolute position of its first token here). Absent: 0.
 * Sequence b with c = c_b and l tokens in this call:
 *   - starts from slot table[b][(c-1)/K] when c > 0 (and has_initial_state[b] != 0 if given), else from zero;
 *   - for every block j whose end (j+1)K lies strictly inside (c, c+l), the state after token (j+1)K-1 is
 *     written to table[b][j];
 *   - its final state (after c+l tokens) is written to table[b][(c+l-1)/K] (a partial block's state: the call
 *     that completes the block overwrites it).
 * Entries equal to pad_slot_id mean "no slot": a boundary write there is skipped; a sequence whose final entry is
 * pad_slot_id is padding (outputs 0, nothing read or written); the entry a sequence starts from may not be
 * pad_slot_id. M must cover (c+l-1)/K; entries outside [first read, final] are never read. A sequence with l = 0
 * reads no entry, writes no slot and has no output. out, out_z and x are those of the call without blocks, and
 * each boundary state is the final state of a call ending at that boundary. Slots written by the call must be
 * distinct, and no sequence may start from a slot another sequence writes. CPU calls check every entry they read
 * (INVALID_ARGUMENT naming it); on CUDA an entry outside [0, S), a starting entry equal to pad_slot_id or a
 * negative context length gives that sequence NaN outputs and touches no slot.
 * The backward has no block fields (the gradients do not depend on where states are cached): pass the states the
 * sequences started from as h0 (h0[b] = ssm_states[table[b][(c_b-1)/K]] gathered before the forward, a zero row
 * where c_b = 0) with the same cu_seqlens, and padding as cache_indices (the final entries, or any non-pad value).
 */
typedef struct selscan_fwd_args_t {
  size_t struct_size;          /* sizeof(selscan_fwd_args_t) */
  /* inputs */
  selscan_tensor_t u, delta, A, B, C;
  selscan_tensor_t D;          /* optional: skip connection, y += D[d] * u */
  selscan_tensor_t z;          /* optional: gate, out_z = y * silu(z) */
  selscan_tensor_t delta_bias; /* optional */
  selscan_tensor_t h0;         /* optional: initial state (not in upstream) */
  int32_t delta_softplus;      /* 0 or 1 */
  int32_t flags;               /* reserved, must be 0 */
  /* outputs */
  selscan_tensor_t out;        /* required: y (before the gate) */
  selscan_tensor_t out_z;      /* required iff z is given */
  selscan_tensor_t x;          /* optional: chunk states, needed by backward when L > 2048 */
  selscan_tensor_t last_state; /* optional: the true state after position L-1 */
  /* since 0.3: serving (see "Serving" above and docs/serving.md); all absent/0 is the call described above */
  selscan_tensor_t cu_seqlens;        /* optional: (Bt+1,) INT32/INT64 offsets of sequences packed along L */
  selscan_tensor_t ssm_states;        /* optional, read and written in place: state pool (S, D, N), wtype */
  selscan_tensor_t cache_indices;     /* optional: (Bt,) INT32/INT64, each sequence's slot in ssm_states */
  selscan_tensor_t has_initial_state; /* optional: (Bt,) BOOL/INT32, 0 = start from zero */
  int64_t pad_slot_id;                /* with cache_indices or block_table: the entry that marks padding */
  /* since 0.4: block-wise state caching (see "Block-wise state caching" above); 0/absent is the 0.3 call */
  int64_t state_block_size;           /* K: tokens per cached block; 0 = off, > 0 needs block_table */
  selscan_tensor_t block_table;       /* (Bt, M) INT32/INT64: slot of each sequence's blocks (replaces cache_indices) */
  selscan_tensor_t context_lens;      /* optional: (Bt,) INT32/INT64, tokens of each sequence before this call */
} selscan_fwd_args_t;

/* Every tensor absent, softplus off, flags 0: set the tensors the call needs. */
#define SELSCAN_FWD_ARGS_INIT                                                                                   \
  {sizeof(selscan_fwd_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,                   \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,     \
   SELSCAN_TENSOR_INIT, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, 0, 0, SELSCAN_TENSOR_INIT, \
   SELSCAN_TENSOR_INIT}

typedef struct selscan_bwd_args_t {
  size_t struct_size;          /* sizeof(selscan_bwd_args_t) */
  /* the forward's inputs, as given to selscan_fwd */
  selscan_tensor_t u, delta, A, B, C, D, z, delta_bias, h0;
  int32_t delta_softplus;      /* 0 or 1 */
  int32_t deterministic;       /* 1: bitwise-reproducible reductions (fixed order, no float atomics) */
  /* what the forward saved */
  selscan_tensor_t dout;       /* gradient of out_z if z is given, else of out */
  selscan_tensor_t x;          /* chunk states from selscan_fwd; required when L > 2048 */
  selscan_tensor_t out;        /* the forward's out (pre-gate y); required iff z is given */
  /* outputs: all overwritten (the caller need not zero them) */
  selscan_tensor_t du, ddelta, dA, dB, dC;
  selscan_tensor_t dD;          /* required iff D is given */
  selscan_tensor_t dz;          /* required iff z is given */
  selscan_tensor_t ddelta_bias; /* required iff delta_bias is given */
  selscan_tensor_t dh0;         /* optional, only with h0 */
  selscan_tensor_t out_z;       /* optional, only with z: recomputed out * silu(z) (upstream recompute_out_z) */
  /* since 0.2 */
  int32_t flags;                /* reserved, must be 0 */
  int32_t reserved;             /* must be 0 (an explicit field, so the struct has no tail padding for a later
                                   version's field to land in unseen) */
  /* since 0.3: serving, as given to selscan_fwd (the pool itself is not an argument: the states a call started
     from are its h0, gathered before the forward overwrote their slots) */
  selscan_tensor_t cu_seqlens;        /* optional: (Bt+1,) INT32/INT64, as in the forward */
  selscan_tensor_t cache_indices;     /* optional: (Bt,) INT32/INT64; only its padding entries matter here */
  selscan_tensor_t has_initial_state; /* optional: (Bt,) BOOL/INT32, with h0: rows of 0 read as zero states */
  int64_t pad_slot_id;                /* with cache_indices, as in the forward */
} selscan_bwd_args_t;

/* Every tensor absent, softplus and deterministic off, flags 0. */
#define SELSCAN_BWD_ARGS_INIT                                                                                   \
  {sizeof(selscan_bwd_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,                   \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,     \
   SELSCAN_TENSOR_INIT, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,     \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, 0, 0,                    \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, 0}

/* --------------------------------------------------------------------------------------------- 5b */
/*
 * The decode step (since 0.3), upstream's selective_state_update: T >= 1 new tokens per sequence advance that sequence's
 * state in place (or into another slot, since 0.4: see below), and each token gets its output. T > 1 serves
 * speculative decoding.
 *
 * Two forms, told apart by state's ndim. The Mamba-1 form is the heads form with H = D heads of P = 1
 * channel each, so both run through one code path (and one kernel):
 *                        Mamba-1 form (state 3-D)        heads form (state 4-D)
 *   state  (in and out)  (S, D, N)                       (S, H, P, N)        FLOAT32, or x's dtype
 *   x, dt, z, out        (Bt, D)  or (Bt, T, D)          (Bt, H, P)  or (Bt, T, H, P)
 *   A                    (D, N)                          (H, P, N)           FLOAT32
 *   D, dt_bias           (D,)                            (H, P)              FLOAT32
 *   B, C                 (Bt, [T,] [G,] N) in both forms: the T dim iff x has one; without a G dim, G = 1
 *   state_batch_indices  (Bt,)                                               INT32 or INT64
 * x is FLOAT32, FLOAT16 or BFLOAT16 (itype); out has x's dtype; dt, z, B and C are each FLOAT32 or itype.
 * N = dstate in [1, SELSCAN_MAX_DSTATE]; G divides H (D in the Mamba-1 form) and head h uses group h / (H / G).
 * Any non-negative strides: inputs may broadcast with stride 0 (Mamba-2 passes A (H, P, N) with strides
 * (1, 0, 0), and dt, D and dt_bias with stride 0 over P), and B and C may be views of one tensor. The outputs,
 * out and state, may not share memory with each other, with any input, or between their own elements.
 *
 * Math, per sequence b, token t (in order), head h, channel p, state n, in fp32 (docs/serving.md):
 *   dt' = dt + dt_bias;  with dt_softplus, dt' = softplus(dt') (dt' itself above 20)
 *   s_n = s_n * exp(A[h,p,n] dt') + B[b,t,g,n] dt' x            (s: the state of slot idx[b], channel (h, p))
 *   out = sum_n s_n C[b,t,g,n] + D[h,p] x;  with z, out *= z * sigmoid(z)
 * The slot's state is read once, carried in fp32 through the T tokens and written back once (rounded to its
 * dtype). out uses the unrounded state.
 *
 * Slots. Without state_batch_indices, S must equal Bt and sequence b uses slot b. With it, sequence b uses
 * slot idx[b], and an entry equal to pad_slot_id is padding: that sequence's out is 0 and no slot is read or
 * written (CUDA-graph batches padded to a fixed size). The indices are read on the device only, so the call
 * cannot report a bad one: an entry outside [0, S) that is not pad_slot_id writes NaN to its out and touches no
 * slot; two sequences naming the same slot leave that slot undefined. Slots no sequence names are untouched.
 *
 * Separate destination slots (since 0.4; vLLM's and FlashInfer's dst_state_batch_indices). With
 * dst_state_batch_indices (Bt,) INT32 or INT64, given only with state_batch_indices, sequence b reads its state
 * from slot idx[b] and writes the updated state to slot dst[b], leaving slot idx[b] as it was (unless dst[b] ==
 * idx[b], the in-place update). Block-wise state caching uses this when a decode token starts a new block: read
 * the previous block's slot, write the new block's, keep the cached one for prefix hits (docs/serving.md).
 * idx[b] == pad_slot_id is padding as above whatever dst[b] holds; dst[b] == pad_slot_id (idx[b] a slot)
 * computes out and writes no state. No two sequences may write the same slot, and no sequence may read a slot
 * another sequence writes (two sequences may read the same slot). On the CPU the call checks all of this and
 * the dst entry of every sequence that reads a slot (in [0, S) or pad_slot_id) and rejects a violation; on CUDA
 * a dst entry outside [0, S) that is not pad_slot_id writes NaN to its out and touches no slot, and overlapping
 * slots are undefined.
 *
 * Needs no workspace. Like every call it only enqueues work on exec's stream: CUDA-graph capturable.
 */
typedef struct selscan_state_update_args_t {
  size_t struct_size;                   /* sizeof(selscan_state_update_args_t) */
  /* inputs */
  selscan_tensor_t x, dt, A, B, C;
  selscan_tensor_t D;                   /* optional: skip connection, out += D * x */
  selscan_tensor_t z;                   /* optional: gate, out *= z * sigmoid(z) */
  selscan_tensor_t dt_bias;             /* optional */
  selscan_tensor_t state_batch_indices; /* optional: the slot of each sequence */
  int64_t pad_slot_id;                  /* the index entry that means padding (SELSCAN_STATE_UPDATE_ARGS_INIT: -1) */
  int32_t dt_softplus;                  /* 0 or 1 */
  int32_t flags;                        /* reserved, must be 0 */
  /* in and out */
  selscan_tensor_t state;               /* the state pool, updated in place */
  /* output */
  selscan_tensor_t out;
  /* since 0.4 */
  selscan_tensor_t dst_state_batch_indices; /* optional, only with state_batch_indices: the slot each sequence's
                                               updated state is written to (read from state_batch_indices') */
} selscan_state_update_args_t;

/* Every tensor absent, pad_slot_id -1 (upstream's and vLLM's PAD_SLOT_ID), softplus off, flags 0. A struct
 * zeroed by other means has pad_slot_id 0: set it. */
#define SELSCAN_STATE_UPDATE_ARGS_INIT                                                                        \
  {sizeof(selscan_state_update_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,         \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,     \
   SELSCAN_TENSOR_INIT, -1, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT}

/* The decode step. All tensors live on exec's device; exec's workspace is not used. Asynchronous on CUDA. */
SELSCAN_API selscan_status_t selscan_state_update(const selscan_state_update_args_t* args,
                                                  const selscan_exec_t* exec);

/* --------------------------------------------------------------------------------------------- 5c */
/*
 * The causal depthwise convolution (since 0.5): causal-conv1d's causal_conv1d_fn, its backward and
 * causal_conv1d_update, the convolution every Mamba block runs right before the scan.
 *
 * Shapes (Bt = batch, D = dim, L = seqlen, W = width in {2, 3, 4}):
 *   x, out, dout, dx                                  (Bt, D, L)    itype = FLOAT32 | FLOAT16 | BFLOAT16 (x's),
 *                                                                   any strides; channel-first (stride 1 over
 *                                                                   L) and channel-last (stride 1 over D) are
 *                                                                   the fast layouts
 *   weight, dweight                                   (D, W)        wtype = FLOAT32 or itype (weight's); dweight
 *                                                                   FLOAT32 or wtype; any strides
 *   bias, dbias                                       (D,)          wtype (dbias: dweight's dtype)
 *   initial_states, final_states, dinitial_states,
 *   dfinal_states                                     (Bt, D, W-1)  itype, any strides
 *   seq_idx                                           (Bt, L)       INT32, any strides
 * Math, in fp32, per sequence b, channel d, time t; xe(t) is x[b,d,t] for t >= 0 and, for t < 0,
 * initial_states[b,d,W-1+t] (0 without initial_states):
 *   y[b,d,t] = bias[d] + sum_{k<W} weight[d,k] * xe(t-(W-1)+k);  out = y, or y * sigmoid(y) with SILU
 *   final_states[b,d,j] = xe(L-(W-1)+j)   (the last W-1 inputs; initial states, or 0, where L < W-1)
 * seq_idx (upstream's packing inside a batch row): a term whose position t' = t-(W-1)+k has t' < 0 or
 * seq_idx[b,t'] != seq_idx[b,t] is 0; a position with seq_idx < 0 is padding (out 0, no gradient). Not with
 * initial_states, final_states or cu_seqlens (INVALID_ARGUMENT).
 *
 * Serving, as the scan's (fields after `final_states`; all absent/0 is the call above):
 *   cu_seqlens (Bt+1,) INT32 or INT64: Bt sequences packed along time; x, out, dout, dx are (1, D, total_L);
 *     sequence b is time [cu[b], cu[b+1]) and is convolved on its own; initial_states, final_states and their
 *     gradients stay (Bt, D, W-1), one row per sequence. Contract as the scan's (checked for CPU calls; on
 *     CUDA read on the device, clamped into [0, total_L]).
 *   conv_states (S, D, state_len) itype, state_len >= W-1, read and written in place (forward only): sequence b
 *     starts from the last W-1 columns of slot cache_indices[b] (slot b without cache_indices, then S = Bt) and
 *     leaves there its last state_len inputs: column j becomes xe(len_b - state_len + j) (older columns of the
 *     slot shift left, zeros where the sequence started from zero). Not with initial_states or final_states.
 *     A packed sequence of length 0 reads and writes no slot (as in the scan's block-wise caching); two
 *     sequences naming one slot are rejected on the CPU and leave it undefined on CUDA.
 *   cache_indices (Bt,) INT32 or INT64 with pad_slot_id, and has_initial_state (Bt,) BOOL or INT32: as the
 *     scan's (a padding sequence's out and final_states row are 0 and no slot is touched; 0 starts sequence b
 *     from zero, its initial_states row or slot unread). Without conv_states, cache_indices only marks padding.
 *
 * The decode update (selscan_conv1d_update), causal_conv1d_update: T >= 1 new tokens per sequence.
 *   x, out        (Bt, D) or (Bt, D, T)   itype, any strides
 *   conv_state    (S, D, state_len)       itype or FLOAT32, state_len >= W-1, read and written in place
 *   weight, bias  as above
 *   cache_seqlens (Bt,) INT32 or INT64, optional: the state is a circular buffer; sequence b's tokens go to
 *     columns (cache_seqlens[b] + i) mod state_len, and the W-1 inputs before them are read from the columns
 *     before. Without it the state shifts left by T and the tokens fill its last columns.
 *   conv_state_indices (Bt,) INT32 or INT64, optional, with pad_slot_id: sequence b uses slot idx[b]; an entry
 *     equal to pad_slot_id is padding (out 0, no slot touched). Without it S = Bt. On CUDA an entry outside
 *     [0, S) writes NaN to that sequence's out and touches no slot (CPU calls reject it).
 *
 * Backward: dx, dweight, dbias (iff bias), dinitial_states (optional, only with initial_states) are overwritten;
 * dfinal_states (optional) is the gradient flowing into final_states. deterministic = 1 makes dweight and
 * dbias bitwise reproducible (fixed-order sums). CUDA backward calls need the workspace that
 * selscan_conv1d_bwd_workspace_size reports (0 on CPU).
 */
typedef enum selscan_activation_t {
  SELSCAN_ACTIVATION_NONE = 0,
  SELSCAN_ACTIVATION_SILU = 1 /* y * sigmoid(y); causal-conv1d's "silu" and "swish" */
} selscan_activation_t;

typedef struct selscan_conv1d_fwd_args_t {
  size_t struct_size;              /* sizeof(selscan_conv1d_fwd_args_t) */
  /* inputs */
  selscan_tensor_t x;              /* (Bt, D, L) */
  selscan_tensor_t weight;         /* (D, W) */
  selscan_tensor_t bias;           /* optional (D,) */
  selscan_tensor_t seq_idx;        /* optional (Bt, L) INT32 */
  selscan_tensor_t initial_states; /* optional (Bt, D, W-1) */
  int32_t activation;              /* selscan_activation_t */
  int32_t flags;                   /* reserved, must be 0 */
  /* outputs */
  selscan_tensor_t out;            /* required, like x */
  selscan_tensor_t final_states;   /* optional (Bt, D, W-1) */
  /* serving (see above) */
  selscan_tensor_t cu_seqlens;        /* optional (Bt+1,) INT32/INT64 */
  selscan_tensor_t conv_states;       /* optional, in place: pool (S, D, state_len) */
  selscan_tensor_t cache_indices;     /* optional (Bt,) INT32/INT64 */
  selscan_tensor_t has_initial_state; /* optional (Bt,) BOOL/INT32 */
  int64_t pad_slot_id;                /* with cache_indices (SELSCAN_CONV1D_FWD_ARGS_INIT: -1) */
} selscan_conv1d_fwd_args_t;

#define SELSCAN_CONV1D_FWD_ARGS_INIT                                                                          \
  {sizeof(selscan_conv1d_fwd_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,         \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,                  \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, -1}

typedef struct selscan_conv1d_bwd_args_t {
  size_t struct_size;              /* sizeof(selscan_conv1d_bwd_args_t) */
  /* the forward's inputs, as given to selscan_conv1d_fwd */
  selscan_tensor_t x, weight, bias, seq_idx, initial_states;
  int32_t activation;              /* selscan_activation_t */
  int32_t deterministic;           /* 1: bitwise-reproducible dweight / dbias */
  selscan_tensor_t cu_seqlens;     /* optional, as in the forward */
  /* gradients in */
  selscan_tensor_t dout;           /* like x */
  selscan_tensor_t dfinal_states;  /* optional (Bt, D, W-1) */
  /* gradients out: overwritten */
  selscan_tensor_t dx;             /* required, like x */
  selscan_tensor_t dweight;        /* required (D, W) */
  selscan_tensor_t dbias;          /* required iff bias */
  selscan_tensor_t dinitial_states;/* optional, only with initial_states */
  int32_t flags;                   /* reserved, must be 0 */
  int32_t reserved;                /* must be 0 */
} selscan_conv1d_bwd_args_t;

#define SELSCAN_CONV1D_BWD_ARGS_INIT                                                                          \
  {sizeof(selscan_conv1d_bwd_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,         \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,                  \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,   \
   0, 0}

typedef struct selscan_conv1d_update_args_t {
  size_t struct_size;                  /* sizeof(selscan_conv1d_update_args_t) */
  /* inputs */
  selscan_tensor_t x;                  /* (Bt, D) or (Bt, D, T) */
  selscan_tensor_t weight;             /* (D, W) */
  selscan_tensor_t bias;               /* optional (D,) */
  selscan_tensor_t cache_seqlens;      /* optional (Bt,) INT32/INT64: circular buffer positions */
  selscan_tensor_t conv_state_indices; /* optional (Bt,) INT32/INT64: the slot of each sequence */
  int64_t pad_slot_id;                 /* the index entry that means padding (INIT: -1) */
  int32_t activation;                  /* selscan_activation_t */
  int32_t flags;                       /* reserved, must be 0 */
  /* in and out */
  selscan_tensor_t conv_state;         /* (S, D, state_len), updated in place */
  /* output */
  selscan_tensor_t out;                /* like x */
} selscan_conv1d_update_args_t;

#define SELSCAN_CONV1D_UPDATE_ARGS_INIT                                                                       \
  {sizeof(selscan_conv1d_update_args_t), SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT,      \
   SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT, -1, 0, 0, SELSCAN_TENSOR_INIT, SELSCAN_TENSOR_INIT}

/* All tensors live on exec's device; asynchronous on CUDA (stream order). The forward and the update need no
 * workspace; the backward needs selscan_conv1d_bwd_workspace_size's bytes on CUDA. */
SELSCAN_API selscan_status_t selscan_conv1d_fwd(const selscan_conv1d_fwd_args_t* args, const selscan_exec_t* exec);
SELSCAN_API selscan_status_t selscan_conv1d_bwd_workspace_size(const selscan_conv1d_bwd_args_t* args,
                                                               const selscan_exec_t* exec, size_t* bytes);
SELSCAN_API selscan_status_t selscan_conv1d_bwd(const selscan_conv1d_bwd_args_t* args, const selscan_exec_t* exec);
SELSCAN_API selscan_status_t selscan_conv1d_update(const selscan_conv1d_update_args_t* args,
                                                   const selscan_exec_t* exec);

/* ---------------------------------------------------------------------------------------------- 6 */
/* SELSCAN_VERSION_STRING of the loaded library, e.g. "0.4.0" */
SELSCAN_API const char* selscan_version_string(void);
/* SELSCAN_VERSION of the loaded library (compare with the header's to detect a mismatch) */
SELSCAN_API int32_t selscan_version(void);
/* Short, static description of a status ("invalid argument", ...). Never NULL. */
SELSCAN_API const char* selscan_status_string(selscan_status_t status);
/* The detailed message of the last failing call on this thread ("" if none). Valid until the next call. */
SELSCAN_API const char* selscan_last_error(void);
/* One line: version, CUDA toolkit used at build ("none" without CUDA), SASS and PTX targets carried. */
SELSCAN_API const char* selscan_build_info(void);

/* Number of visible CUDA devices (0 when built without CUDA or without a driver; never an error). */
SELSCAN_API selscan_status_t selscan_cuda_device_count(int32_t* count);
/* Whether this build can run on CUDA device `device_index`, without launching anything. SUCCESS if it can;
 * ARCH_MISMATCH (with a message naming the device, what the build carries and the rebuild command),
 * NO_DEVICE or CUDA_NOT_BUILT otherwise. */
SELSCAN_API selscan_status_t selscan_check_device(int32_t device_index);

/* Workspace the call needs on exec->device (0 on CPU). Validates the arguments like the call itself. The
 * workspace given to the call must be aligned to SELSCAN_WORKSPACE_ALIGNMENT bytes. */
SELSCAN_API selscan_status_t selscan_fwd_workspace_size(const selscan_fwd_args_t* args,
                                                        const selscan_exec_t* exec, size_t* bytes);
SELSCAN_API selscan_status_t selscan_bwd_workspace_size(const selscan_bwd_args_t* args,
                                                        const selscan_exec_t* exec, size_t* bytes);

/* The selective scan. All tensors live on exec's device. Asynchronous on CUDA (stream order). */
SELSCAN_API selscan_status_t selscan_fwd(const selscan_fwd_args_t* args, const selscan_exec_t* exec);
SELSCAN_API selscan_status_t selscan_bwd(const selscan_bwd_args_t* args, const selscan_exec_t* exec);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SELSCAN_SELSCAN_H */
