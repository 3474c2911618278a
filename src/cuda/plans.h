// Launch plans of the CUDA kernels, one type per kernel family, and the shared-memory sizes that the host must know
// before a launch. The kernel choice (src/cuda/select.cpp) fills a plan; the launchers (kernels/) execute it without
// deciding anything; the kernels carve their shared memory with the same constants and layouts.
// Host-compilable (no CUDA headers), so the CPU tests check the rules and layouts without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "problem.h"

#if defined(__CUDACC__)
#define SELSCAN_HD __host__ __device__
#else
#define SELSCAN_HD
#endif

namespace selscan::cuda {

// Whether the running code (DeviceProps::ptx; __CUDA_ARCH__ / 10) has the copy-engine instances (the forward's and the
// backward's thread-states kernels, src/cuda/tile_map.h): they compile their copies for __CUDA_ARCH__ == 900 only,
// elsewhere a stub.
SELSCAN_HD constexpr bool copy_engine_arch(int ptx) { return ptx == 90; }

// ------------------------------------------------------------------- forward, warp-scan (kernels/fwd/warp.cuh)
// A warp per channel, up to kMaxWarps channels of one group per block; a lane holds K consecutive steps of a piece.
namespace fwd_warp {
constexpr int kMaxWarps = 8;
constexpr int kMinBlocks = 2;  // launch-bounds occupancy hint
// K steps per lane and the states of variable B/C staged per barrier pair, real and complex weights.
constexpr int kItemsReal = 16, kItemsComplex = 8;
constexpr int kStateTileReal = 16, kStateTileComplex = 8;
constexpr int kSlots = 5;  // per warp and state in shared memory: running P and H, A, the B scale, the C coefficient

// Block mode with the block size a multiple of kItemsReal (kernels/fwd/warp.cuh, the aligned instance): the most
// block ends one piece of 32 lanes x kItemsReal steps can hold (its block-end states of a state tile wait in shared
// memory, one row of kStateTileReal per end, and the end's slot in two more floats); 0 where that instance does not
// run. Real weights only (serving).
SELSCAN_HD inline int block_ends_per_piece(int64_t block_size) {
  if (block_size <= 0 || block_size % kItemsReal != 0) return 0;
  const int64_t per_end = block_size / kItemsReal;  // lanes per block
  return static_cast<int>((32 + per_end - 1) / per_end);
}

// Dynamic shared memory of one block: the staged variable B/C rows of a state tile (fp32), every warp's slots and,
// in block mode, every warp's block-end rows.
inline size_t smem_bytes(bool cplx, bool var_B, bool var_C, int warps, int64_t dstate, int64_t block_size = 0) {
  const size_t cw = cplx ? 2 : 1;  // floats per weight
  const size_t stage = static_cast<size_t>(cplx ? kStateTileComplex : kStateTileReal) *
                       (cplx ? kItemsComplex : kItemsReal) * cw * 32 * sizeof(float);
  const size_t ends = static_cast<size_t>(block_ends_per_piece(block_size)) * (kStateTileReal + 2) * sizeof(float);
  return (var_B ? stage : 0) + (var_C ? stage : 0) +
         static_cast<size_t>(warps) * (static_cast<size_t>(dstate) * kSlots * cw * sizeof(float) + ends);
}

struct Plan {
  int warps = 1;                // channels per block
  int64_t tiles_per_group = 1;  // blocks per (batch, group); a kernel parameter
  int64_t blocks = 0;           // batch * groups * tiles_per_group
  size_t smem = 0;              // dynamic shared memory per block
};
}  // namespace fwd_warp

// ---------------------------------------------------------------- forward, thread-states (kernels/fwd/ts.cuh)
// A thread runs kS states of one channel sequentially in time; tpc threads per channel, ch channels per block.
namespace fwd_ts {
// States per thread (2 measured slower on every row: twice the threads, more overhead).
constexpr int kS = 4;
constexpr int kMaxThreads = 128;  // threads per block
// Threads per channel: dstate <= kS * kMaxTpc = 32. At dstate 64 (16 threads per channel) the warp-scan kernel
// measured faster: the epilogue sums 16 partials per output.
constexpr int kMaxTpc = 8;
// The three launch-bounds variants of the dense instances: 3 blocks per SM (up to 168 registers, no spills), 4 (128
// registers, no spills) or 5 (96 registers); serving instances take 4 (src/cuda/select.cpp).
constexpr int kMinBlocksRoomy = 3, kMinBlocksFew = 4, kMinBlocksMany = 5;
// Variable B/C tiles are [step][state] rows; each group of one staging vector's steps starts 8 floats further
// (kernels/fwd/ts.cuh, bc_row). The last group's shift: tt <= 32 steps in groups of >= 4.
constexpr int kBcPad = (32 / 4 - 1) * 8;
// Threads per channel of the packed B/C instance (kernels/fwd/ts.cuh, kPackBC): the default plan's (dstate 13-16).
constexpr int kPackedTpc = 4;

// The kernel's launch shape, passed to it by value.
struct Shape {
  int tpc = 1;                  // threads per channel
  int ch = 1;                   // channels per block (blockDim.x = ch * tpc)
  int tt = 8;                   // time steps per tile (8, 16 or 32; divides kChunk)
  int64_t tiles_per_group = 1;  // channel tiles per group
};

// Whether a dense call runs the instance with the packed B/C tile (kernels/fwd/launch.cuh): a 16-bit itype with
// variable B and C at kPackedTpc threads a channel.
SELSCAN_HD constexpr bool packed_bc(int isz, bool var_B, bool var_C, int tpc) {
  return isz == 2 && var_B && var_C && tpc == kPackedTpc;
}
// The instance that stages its raw tile inputs by cp.async into per-thread shared slots (kernels/fwd/ts.cuh, kAsync):
// the packed one at 5 blocks per SM, whose 96 registers spilled 68/76 bytes without the slots and 4/8 (outside its
// loops) with them: 4x5120x2048:16 bf16 0.4134 -> 0.3819 ms, fp16 0.4047 -> 0.3800 (run 127). In the 3-blocks
// instances the slots measured slower (8x1536x2048:16 bf16 0.2244 -> 0.2408, fp32 0.2830 -> 0.2945), and in the packed
// 4-blocks one with the early reads too (0.3993 -> 0.4042); the other 4- and 5-blocks instances spilled with them or
// were not tried.
// Only in code made for the parts with 228 KB of shared memory per SM (sm_90, sm_100/103): on 100-164 KB parts
// (sm_80/86/89, sm_120) the slots would cost resident blocks. Host and device decide it from the same number, the
// virtual arch of the running code (DeviceProps::ptx; __CUDA_ARCH__ / 10), so they cannot disagree, JIT included.
SELSCAN_HD constexpr bool slot_arch(int ptx) { return ptx == 90 || (ptx >= 100 && ptx < 110); }
SELSCAN_HD constexpr bool raw_slots(int min_blocks, bool serving, bool packed, bool arch) {
  return arch && !serving && packed && min_blocks == kMinBlocksMany;
}
constexpr int kRawSlots = 6;  // per thread, 16 bytes each: the next tile's u, delta, B, C; this tile's z and u
// Shared memory in floats: delta' and delta'u [ch][tt+4], B and C [tt][tpc*kS] (+ kBcPad) when variable, y partials
// [threads][tt+4], D u [ch][tt+4] (read by the fp32 variant only), then, where raw_slots, kRawSlots 16-byte slots a
// thread; 16-bit instances lay them over D u's rows, which they never use (the packed 5-blocks instance of the
// issue's 4x5120x2048:16 row: 44,480 bytes a block instead of 49,088, so 5 blocks still fit in 228 KB). Rows padded
// by 4 floats keep float4 alignment.
inline int64_t smem_floats(const Shape& c, bool var_B, bool var_C, bool slots, int isz) {
  const int64_t row = c.tt + 4;
  const int64_t bc = static_cast<int64_t>(c.tt) * c.tpc * kS + kBcPad;
  const int64_t threads = static_cast<int64_t>(c.ch) * c.tpc;
  const int64_t ud = c.ch * row, base = 3 * ud + (var_B ? bc : 0) + (var_C ? bc : 0) + threads * row;
  if (!slots) return base;
  const int64_t slot_floats = threads * kRawSlots * 4;
  return isz == 2 ? base - ud + (slot_floats > ud ? slot_floats : ud) : base + slot_floats;
}

// The copy-engine form of the slots instance (kernels/fwd/ts.cuh, kTma): on sm_90 each of the next tile's raw inputs
// (and this tile's z) arrives as one tensor-map box whose rows are exactly the slot rows of the block's threads,
// which needs blocks of 32 channels x kPackedTpc threads and 32-step tiles. The slots then start on 128 bytes: the
// plan's shared memory carries kTmaSlack bytes for that alignment.
constexpr int kTmaCh = 32, kTmaTt = 32;
constexpr size_t kTmaSlack = 128;
// A bound on that form's static shared memory (its barrier and the sequence fields, well under it); it counts against
// the per-block opt-in limit beside the dynamic part.
constexpr int64_t kTmaStaticSmem = 1024;

struct Plan {
  Shape shape;
  int min_blocks = kMinBlocksFew;  // which launch-bounds variant
  int64_t blocks = 0;              // batch * groups * shape.tiles_per_group
  size_t smem = 0;
  bool copy_engine = false;  // the slots instance's copy-engine form (src/cuda/select.cpp, fwd_copy_engine)
};
}  // namespace fwd_ts

// Which kernel a plan runs: warp-scan (a warp per channel, time across lanes) or thread-states (a thread per few
// states, sequential in time).
enum class Kernel : int { warp, ts };

struct FwdPlan {
  Kernel kernel = Kernel::warp;
  fwd_warp::Plan warp;  // when kernel == warp
  fwd_ts::Plan ts;      // when kernel == ts
};

// ------------------------------------------------------------------ backward, warp-scan (kernels/bwd/warp.cuh)
namespace bwd_warp {
constexpr int kItems = 8;            // K: consecutive time steps per lane
constexpr int kPiece = 32 * kItems;  // time steps per warp per piece
constexpr int kPiecesPerChunk = static_cast<int>(kChunk / kPiece);
constexpr int kMaxWarps = 8;         // channels per block
static_assert(kChunk % kPiece == 0, "a piece must not straddle a chunk of x");

// Shared memory of the main kernel, in floats:
//   per warp: fc [kPiecesPerChunk][N], gcar [N], acc [nacc][N], pcache [4][N] (weights-typed)
//   per warp, when `lane_acc`: lane partials [nacc][N][32]                (weights-typed)
//   block: staged variable B/C rows, raw itype [2][nvar][stile][kPiece*cw] (double-buffered), reduction buffers
//          [nvar][stile][warps][kPiece*cw] (fp32)
struct SmemLayout {
  int64_t per_warp, lane_acc_per_warp, stage, red, total;  // floats
};
SELSCAN_HD inline int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }
SELSCAN_HD inline SmemLayout smem_layout(int64_t N, bool cplx, int nacc, int nvar, bool lane_acc, int warps, int stile,
                                         int isz) {
  const int64_t wsz = cplx ? 2 : 1;
  SmemLayout l;
  l.per_warp = round4((kPiecesPerChunk + 1 + nacc + 4) * N * wsz);
  l.lane_acc_per_warp = lane_acc ? nacc * N * wsz * 32 : 0;
  l.stage = 2 * static_cast<int64_t>(nvar) * stile * kPiece * wsz * isz / 4;  // two buffers of raw itype rows
  l.red = static_cast<int64_t>(nvar) * stile * kPiece * wsz * warps;
  l.total = warps * (l.per_warp + l.lane_acc_per_warp) + l.stage + l.red;
  return l;
}
// Per-lane partials of the per-state sums avoid a warp reduction per state and piece; used when they are small.
SELSCAN_HD inline bool use_lane_acc(int64_t N, bool cplx, int nacc) { return nacc * N * (cplx ? 2 : 1) <= 32; }

struct Plan {
  int warps = 1;                // channels per block
  int stile = 1;                // states per variable-dB/dC reduction round (barrier pair)
  int64_t tiles_per_group = 1;  // channel tiles of `warps` channels per group
  int64_t slots = 1;            // blocks per (b, g)
  int64_t tiles_per_slot = 1;   // channel tiles one block walks in turn
  bool lane_acc = false;        // per-lane partials of the per-state sums
  int64_t blocks = 0;           // batch * groups * slots, capped at the grid limit (the kernel loops over the rest)
  size_t smem = 0;              // dynamic shared memory per block
};
}  // namespace bwd_warp

// --------------------------------------------------------------- backward, thread-states (kernels/bwd/ts.cuh)
// A block is kCh channels (lanes) x tpc warps; warp k holds states 4k..4k+3 of every channel.
namespace bwd_ts {
constexpr int kS = 4;           // states per thread
constexpr int kMaxTpc = 4;      // warps per block: dstate <= 16
constexpr int kCh = 32;         // channels per block; lane = channel
constexpr int kTT = 16;         // steps per tile: a tile's per-thread state history (kTT x kS) lives in registers
constexpr int kRow = kTT + 4;   // padded per-channel row of floats: float4-aligned; the sweep's per-lane float4 reads
                                // (8 channels a quarter-warp, 20 floats apart) are conflict-free
// The per-warp dB/dC reduction buffer: 4 step slots of 32 lane rows of 8 floats, each slot padded by 8 floats (the
// index map, kernels/bwd/ts_maps.h, says why).
constexpr int kRedSlot = 32 * 8 + 8;
constexpr int kRedWarp = 4 * kRedSlot;
constexpr int kMaxGrid = 1024;  // persistent grid cap; bounds the checkpoint workspace
// Row pitch of the variable B/C tiles in shared memory: the widest block's states at every tpc, so the kernel's
// per-step reads are fixed offsets from one base instead of run-time multiples of tpc (columns past tpc * kS unused).
constexpr int kBcPitch = kMaxTpc * kS;

// Shared-memory layout in floats (host and device agree).
struct Layout {
  int dl, du, dt, u, sp, sB, sC, gu, aq, red, dB, dC, acc, eD, raw, total;
};
SELSCAN_HD inline Layout layout(int tpc, int isz) {
  Layout l{};
  const int ch = kCh * kRow, np = tpc * kS;
  int o = 0;
  l.dl = o; o += ch;   // delta' (after bias and softplus)      [ch][kRow]
  l.du = o; o += ch;   // delta' u
  l.dt = o; o += ch;   // dout after the z gate
  l.u = o; o += ch;    // u
  l.sp = o; o += ch;   // d softplus / d delta (1 without softplus)
  l.sB = o; o += kTT * kBcPitch;  // variable B, C as float [t][state], rows kBcPitch apart
  l.sC = o; o += kTT * kBcPitch;
  l.gu = o; o += tpc * ch;  // per warp: sum over its states of dh B      [warp][ch][kRow]
  l.aq = o; o += tpc * ch;  // per warp: sum over its states of A dh ā h(t-1)
  l.red = o; o += tpc * kRedWarp;    // per warp: four steps of 8 dB/dC values per lane (red_at)
  l.dB = o; o += np * kTT;           // the block's dB/dC sums of the tile [state][t]
  l.dC = o; o += np * kTT;
  l.acc = o; o += 3 * kCh * tpc * kS;  // per thread: constant-B/C and dA sums [3][threads][kS]
  l.eD = o; o += 2 * kCh * kTT / 4;    // per (channel, 4 steps): dD and ddelta_bias shares [2][ch * kTT/4]
  o = (o + 3) / 4 * 4;
  l.raw = o;  // raw itype rows: u, delta, dout, z, out [5][ch][kTT]; B, C [2][np][kTT]
  o += (5 * kCh * kTT * isz + 2 * np * kTT * isz + 3) / 4;
  l.total = o;
  return l;
}

// The launch shape (the kernel receives its tpc, ntc, tiles and items: kernels/bwd/ts.cuh, Shape).
struct Plan {
  int threads = 0;        // per block: kCh * tpc
  int tpc = 0;            // warps per block (threads per channel)
  int grid = 0;           // blocks (persistent: each walks work items)
  int ntc = 0;            // tiles per chunk
  int64_t tiles = 0;      // channel tiles per group
  int64_t items = 0;      // work items (b, g, tile)
  size_t smem = 0;        // dynamic shared memory per block
  size_t ck_bytes = 0;    // checkpoint workspace
  bool copy_engine = false;  // the instance whose raw tiles arrive as tensor-map boxes (bwd_copy_engine)
};
// Static shared memory of the copy-engine instance (its barrier and phase words: 520 bytes), rounded up; it counts
// against the same per-block opt-in limit as the dynamic part.
constexpr int64_t kTmaStaticSmem = 1024;
}  // namespace bwd_ts

struct BwdPlan {
  Kernel kernel = Kernel::warp;
  bwd_warp::Plan warp;  // when kernel == warp
  bwd_ts::Plan ts;      // when kernel == ts
  // Shared by both kernels: the per-state accumulators of dA and constant dB/dC, the variable dB/dC images and the
  // workspace that holds them.
  int nacc = 1;              // per-state accumulators: dA [, accB] [, accC]
  int accB = -1, accC = -1;  // their index, or -1 when not needed
  bool det_var = false;      // variable dB/dC as per-slot (warp) or per-tile (ts) images: deterministic mode
  int64_t images = 1;        // variable dB/dC images per tensor, summed in order by the conversion
  int64_t var_elems = 0;     // Bt*G*N*Lp floats of one variable dB/dC image
  int64_t var_row = 0;       // Lp = L*cw rounded up to a multiple of 4 (whole float4 atomics)
  size_t off_pw = 0, off_ps = 0, off_vb = 0, off_vc = 0, off_ck = 0, total = 0;  // workspace layout (bytes)
  size_t zero_bytes = 0;     // bytes from off_vb that start at 0 (the atomically summed images), or 0
};

// ---------------------------------------------------------------- causal depthwise conv1d (kernels/conv1d/)
// Which kernel serves a conv1d call and its launch shape; filled by plan_conv1d_* (src/cuda/select.cpp).
namespace conv1d {
// Channels a thread of the channel-last forward owns: 8 bytes of a 16-bit itype, 16 of fp32 (8 channels took it to
// 141 registers, 3 blocks per SM: too few bytes in flight).
constexpr int kItems = 4;
// Steps a thread of the row kernels owns: 32 bytes of its row (two 16-byte loads in flight per tensor); the plain
// calls' kernels 64 bytes, four 16-byte runs interleaved over the lanes (their setup is paid once per 64 bytes).
constexpr int kRowBytes = 32;
constexpr int kPlainRowBytes = 64;
SELSCAN_HD constexpr int row_items(Dtype t, bool plain) {
  return (plain ? kPlainRowBytes : kRowBytes) / real_bytes(t);
}
constexpr int kThreads = 128;  // threads per block of the main kernels
// Channel-last kernels: a block is row_threads lanes along channels (row_threads * items channels) by
// kThreads / row_threads time groups, each walking `chunk` steps. The forward: kClLanes lanes of kItems channels
// (a warp's step is 256 contiguous bytes of a 16-bit itype). The backward keeps two histories (inputs, gradients)
// and W + 1 partial sums per channel: kClBwdItems channels a thread (4 took 159 registers at W = 4), kClBwdLanes
// lanes (64 contiguous bytes of a 16-bit itype a step) by 8 time groups (a block's tile is 2x longer than with 32
// lanes: half the dweight/dbias partials). kClLanes * kItems channels is the most a block stages (weights).
constexpr int kClLanes = 32;
constexpr int kClBwdLanes = 16;
constexpr int kClBwdItems = 2;
// Bytes of a thread's channels a group of the vector walks loads per tensor: the forward 32 (4 steps of 16-bit, 2
// of fp32), the backward 16 of x and of dout (4 steps of 16-bit, 2 of fp32; 32 spilled at 5 blocks per SM).
constexpr int kClFwdBytes = 32;
constexpr int kClBwdBytes = 16;
}  // namespace conv1d

enum class Conv1dKernel : int {
  rows,    // channel-first: a thread owns row_items consecutive steps of a row; any strides (vec off): generic
  cl,      // channel-last: a thread owns kItems consecutive channels and walks a chunk of time
  update,  // the decode update: a thread per (sequence, channel)
};

struct Conv1dPlan {
  Conv1dKernel kernel = Conv1dKernel::rows;
  bool vec = false;          // 16-byte loads and stores of x, out (dout, dx): unit stride, aligned bases and strides
  int threads = conv1d::kThreads;  // per block
  int row_threads = 0;       // rows: threads per row segment (a power of two <= threads); cl: threads along channels
  int items = conv1d::kItems;  // steps (rows: row_items) or channels (cl) a thread owns
  int64_t chunk = 0;         // rows: steps per segment (row_threads * items); cl: steps a thread walks
  int64_t tiles = 0;         // rows: segments per row; cl: time tiles of a block (chunk * time groups steps each)
  int64_t blocks = 0;        // grid.x (<= 2^31 - 1)
  bool states = false;       // forward: the states kernel follows (final_states, conv_states); backward: dinitial
  int64_t parts = 0;         // backward: partial sums of dweight/dbias per channel, summed in order by the finalize
  bool direct = false;       // backward, one part (one row, one tile): the main kernel writes dweight/dbias itself
  size_t workspace = 0;      // backward: bytes (the partials); 0 otherwise
};

}  // namespace selscan::cuda
