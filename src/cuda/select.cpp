#include "cuda/select.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <string>
#include <utility>

#include "cuda/tile_map.h"
#include "selscan/selscan.h"

namespace selscan::cuda {
namespace {

// ------------------------------------------------------------------------------------------- thresholds
// Every number that decides which kernel runs, or how it is laid out. The measurements named are in
// validation/optimisation-log.md; all were taken on the H200.

// Shared-memory classes by the per-block opt-in limit: 227 KB (sm_90, sm_100), 99-163 KB (sm_80/87: 163 KB; sm_86/89
// and the consumer Blackwell parts, sm_120: 99 KB), below (sm_75: 64 KB, sm_70: 96 KB).
constexpr int64_t kLargeSmemOptin = 227 * 1024;
constexpr int64_t kMediumSmemOptin = 99 * 1024;

// Forward. The thread-states kernel needs at least this many warps per SM: below it the warp-scan kernel, which also
// spreads time over lanes, measured faster (1x2048x65536:16 and 1x5120x512:16, 2 and 5 warps per SM).
constexpr int64_t kFwdTsMinWarpsPerSm = 8;
// By default the thread-states forward serves 4 threads per channel (dstate 13-16) only: it serves every dstate up to
// 32 correctly, but at dstate 4, 8 and 32 the warp-scan kernel measured faster (8x1536x2048:{4,8}, 4x1536x2048:32).
constexpr int kFwdTsDefaultTpc = 4;
// Above this many warps per SM the dense thread-states forward takes its 5-blocks-per-SM variant (96 registers), up
// to it the 4-blocks one (128 registers): each measured faster on its side (4x5120x2048:16 at 19 warps per SM,
// 8x1536x2048:16 at 11.6; launch bounds 4, 5 and 6 compared); at or below kFwdTsRoomyWarpsPerSm the 3-blocks one.
constexpr int64_t kFwdTsManyWarpsPerSm = 16;
// A grid of at most this many warps per SM fits in one wave at 3 blocks per SM of up to 168 registers (12 warps of
// 128-thread blocks, or 6 blocks of 64 threads): there the dense thread-states forward takes its 3-blocks variant,
// whose spare registers let the state loop's shared-memory reads and exponentials issue earlier (8x1536x2048:16 at
// 11.6 warps per SM: bf16 -4.0%, fp16 -6.9%, fp32 -1.1% against the 4-blocks variant; validation/optimisation-log.md).
constexpr int64_t kFwdTsRoomyWarpsPerSm = 12;
// Thread-states forward blocks halve from 128 threads while the grid would have fewer blocks than this per SM, so
// small grids still spread over every SM (a design choice, not tuned).
constexpr int64_t kFwdTsMinBlocksPerSm = 4;

// Backward. The thread-states kernel by default: 4 warps per 32-channel tile (dstate 13-16), calls of at least
// kBwdTsMinWarps warps, on large-class GPUs (the H200 is the one measured). 1x2048x65536:16 (256 warps) and
// 1x5120x512:16 (640) measured faster on the warp-scan backward; the rows of 1536 and 2560 warps faster on the
// thread-states one.
constexpr int kBwdTsDefaultTpc = 4;
constexpr int64_t kBwdTsMinWarps = 1024;
// The warp-scan backward's shared memory by class. The block cap stays within the class's opt-in limit (227 KB,
// 99 KB and more, 64 KB); the staging budget (staged B/C rows and dB/dC reduction buffers, which set the states per
// barrier round) keeps a block near 100 KB in all on large-class parts, so two blocks share an SM as the kernel's
// launch bounds ask. Design choices, not tuned.
constexpr size_t kBwdBlockSmem[] = {64 * 1024, 96 * 1024, 200 * 1024};     // small, medium, large
constexpr int64_t kBwdStagingSmem[] = {32 * 1024, 48 * 1024, 80 * 1024};   // staged B/C rows + reduction buffers
// At most this many states per staging round of variable B/C (a design choice, not tuned).
constexpr int kBwdMaxStateTile = 8;
// Blocks the deterministic warp-scan backward aims for when it trades parallelism for fewer partial images: about 4
// per SM on a 132-SM part (a design choice, not tuned).
constexpr int64_t kDetTargetBlocks = 512;

constexpr int64_t kMaxGridBlocks = 0x7fffffff;  // CUDA's grid.x limit
// Every workspace region starts on this boundary, as the workspace itself does, so regions stay aligned in memory.
constexpr size_t kWorkspaceAlign = SELSCAN_WORKSPACE_ALIGNMENT;

size_t align_up(size_t v) { return (v + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Failure messages (the only formatting here; no fmt, so the CPU tests link this file alone).
Status too_many_blocks(const char* dir, int per_block) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, std::string(dir) + ": batch * dim / " + std::to_string(per_block) +
                                              " exceeds the CUDA grid limit (2^31 - 1 blocks)");
}

Status smem_over_limit(const char* what, size_t need, const DeviceProps& dev) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, std::string(what) + ": needs " + std::to_string(need) +
                                              " bytes of shared memory per block, device " +
                                              std::to_string(dev.ordinal) + " allows " +
                                              std::to_string(dev.smem_optin));
}

// ------------------------------------------------------------------------------------------- forward
// Whether a call of the slots instance takes its copy-engine form (kernels/fwd/ts.cuh, kTma): in sm_90 code, at the
// block and tile shape whose boxes land on the threads' slot rows, every map within the copy engine's limits, and the
// slots' alignment slack and the kernel's static shared memory within the device's limit.
bool fwd_copy_engine(const Problem& p, const DeviceProps& dev, const fwd_ts::Plan& pl) {
  using namespace fwd_ts;
  if (!copy_engine_arch(dev.ptx) || pl.shape.ch != kTmaCh || pl.shape.tt != kTmaTt ||
      pl.shape.tpc != kPackedTpc || static_cast<int64_t>(pl.smem + kTmaSlack) + kTmaStaticSmem > dev.smem_optin)
    return false;
  TileMapSpec specs[kFwdTileMaps];
  fwd_tile_map_specs(p, specs);
  for (int i = 0; i < kFwdTileMaps; ++i)  // u, delta, B and C are always read; z where given
    if ((i < 4 || specs[i].base != nullptr) && !tile_map_fits(specs[i])) return false;
  return true;
}

// The thread-states forward's shape for p, or false where it should not serve p: complex weights, dstate > 32, and
// unless `forced`, too little parallelism or a dstate outside the default range.
bool fwd_ts_plan(const Problem& p, const DeviceProps& dev, bool forced, fwd_ts::Plan* out) {
  using namespace fwd_ts;
  if (p.is_complex || p.dstate > kS * kMaxTpc) return false;
  const bool block_mode = p.serving && p.block_size > 0;
  Shape c;
  while (c.tpc * kS < p.dstate) c.tpc *= 2;
  const int64_t warps = p.batch * p.dim * c.tpc / 32;
  if (!forced && p.batch * p.dim * c.tpc < kFwdTsMinWarpsPerSm * 32 * dev.sms) return false;
  if (!forced && c.tpc != kFwdTsDefaultTpc) return false;
  const int64_t cpg = p.channels_per_group();
  const auto blocks = [&](int threads) {
    const int64_t ch = threads / c.tpc;
    return p.batch * p.groups * ceil_div(cpg, ch);
  };
  int threads = kMaxThreads;
  while (threads > 32 && (blocks(threads) < kFwdTsMinBlocksPerSm * dev.sms || (threads / 2) / c.tpc >= cpg))
    threads /= 2;
  c.ch = threads / c.tpc;
  c.tiles_per_group = ceil_div(cpg, c.ch);
  // The longest tile whose staging takes one 16-byte vector per thread for the u/delta and the B/C tiles.
  const int vec_elems = 16 / real_bytes(p.itype);
  c.tt = 0;
  for (int tt : {32, 16, 8}) {
    // Block mode: block ends (multiples of 16 steps from a context that is one) must fall on the ends of the
    // 16-step pieces a tile runs in (kernels/fwd/ts.cuh).
    if (block_mode && tt % fwd_warp::kItemsReal != 0) continue;
    if (tt < vec_elems) break;
    const int64_t vpr = tt / vec_elems;
    if (c.ch * vpr <= threads && p.dstate * vpr <= threads) {
      c.tt = tt;
      break;
    }
  }
  if (c.tt == 0) return false;
  out->shape = c;
  out->blocks = p.batch * p.groups * c.tiles_per_group;
  const int64_t grid_warps = out->blocks * ceil_div(c.ch * c.tpc, 32);
  // Serving calls at 4 blocks per SM: at 5 block mode's block-end stores spilled in the tile loop, and the packed and
  // pool instance's serving fields cost it 4-12% there (validation/optimisation-log.md).
  if (p.serving)
    out->min_blocks = kMinBlocksFew;
  else if (warps > kFwdTsManyWarpsPerSm * dev.sms)
    out->min_blocks = kMinBlocksMany;
  else
    out->min_blocks = grid_warps <= kFwdTsRoomyWarpsPerSm * dev.sms ? kMinBlocksRoomy : kMinBlocksFew;
  const bool slots = raw_slots(out->min_blocks, p.serving, packed_bc(real_bytes(p.itype), p.var_B, p.var_C, c.tpc),
                               slot_arch(dev.ptx));
  out->smem = static_cast<size_t>(smem_floats(c, p.var_B, p.var_C, slots, real_bytes(p.itype))) * sizeof(float);
  out->copy_engine = slots && fwd_copy_engine(p, dev, *out);
  if (out->copy_engine) out->smem += kTmaSlack;
  return true;
}

fwd_warp::Plan fwd_warp_plan(const Problem& p) {
  using namespace fwd_warp;
  Plan w;
  const int64_t cpg = p.channels_per_group();
  w.warps = static_cast<int>(std::min<int64_t>(kMaxWarps, cpg));
  w.tiles_per_group = ceil_div(cpg, w.warps);
  w.blocks = p.batch * p.groups * w.tiles_per_group;
  w.smem = smem_bytes(p.is_complex, p.var_B, p.var_C, w.warps, p.dstate, p.serving ? p.block_size : 0);
  return w;
}

// ------------------------------------------------------------------------------------------- backward
// The thread-states backward's shape for p, or false where it should not serve p: complex weights, dstate > 16, a
// layout over the class's block budget (fp32 on small-class parts), and unless `forced`, anything but the default
// range above.
bool bwd_ts_plan(const Problem& p, SmemClass cls, bool forced, bwd_ts::Plan* out) {
  using namespace bwd_ts;
  if (p.is_complex || p.dstate > kS * kMaxTpc) return false;
  int tpc = 1;
  while (tpc * kS < p.dstate) tpc *= 2;
  const int64_t tiles = ceil_div(p.channels_per_group(), kCh);
  const int64_t items = p.batch * p.groups * tiles;
  if (!forced && (cls != SmemClass::large || tpc != kBwdTsDefaultTpc || items * tpc < kBwdTsMinWarps)) return false;
  const size_t smem = static_cast<size_t>(layout(tpc, real_bytes(p.itype)).total) * sizeof(float);
  if (smem > kBwdBlockSmem[static_cast<int>(cls)]) return false;
  out->threads = kCh * tpc;
  out->tpc = tpc;
  out->tiles = tiles;
  out->items = items;
  out->grid = static_cast<int>(std::min<int64_t>(items, kMaxGrid));
  const int64_t lc = std::min(p.seqlen, kChunk);
  out->ntc = static_cast<int>(ceil_div(lc, kTT));
  out->smem = smem;
  out->ck_bytes = static_cast<size_t>(out->grid) * out->ntc * kCh * tpc * 4 * sizeof(float);
  return true;
}

bwd_warp::Plan bwd_warp_plan(const Problem& p, SmemClass cls, int nacc, int nvar, bool det_var) {
  using namespace bwd_warp;
  Plan w;
  const bool cplx = p.is_complex;
  const int64_t wsz = cplx ? 2 : 1;
  const int isz = real_bytes(p.itype);
  w.lane_acc = use_lane_acc(p.dstate, cplx, nacc);
  const int64_t cpg = p.channels_per_group();
  // Channels per block: as many as the group has (up to 8) and the shared memory allows.
  int warps = kMaxWarps;
  while (warps > 1 && warps / 2 >= cpg) warps /= 2;
  const size_t cap = kBwdBlockSmem[static_cast<int>(cls)];
  const auto bytes = [&](int nw, int s) {
    return static_cast<size_t>(smem_layout(p.dstate, cplx, nacc, nvar, w.lane_acc, nw, s, isz).total) * sizeof(float);
  };
  while (warps > 1 && bytes(warps, 1) > cap) warps /= 2;
  int stile = static_cast<int>(p.dstate);  // without variable B/C the state loop has no barriers
  if (nvar > 0) {
    const int64_t per_state = static_cast<int64_t>(nvar) * kPiece * wsz * (warps * 4 + 2 * isz);
    stile = static_cast<int>(std::clamp<int64_t>(kBwdStagingSmem[static_cast<int>(cls)] / per_state, 1,
                                                 std::min<int64_t>(p.dstate, kBwdMaxStateTile)));
    while (stile > 1 && bytes(warps, stile) > cap) --stile;
  }
  w.warps = warps;
  w.stile = stile;
  w.smem = bytes(warps, stile);
  w.tiles_per_group = ceil_div(cpg, warps);
  if (det_var) {
    const int64_t want = std::max<int64_t>(1, ceil_div(kDetTargetBlocks, p.batch * p.groups));
    const int64_t slots = std::min(w.tiles_per_group, want);
    w.tiles_per_slot = ceil_div(w.tiles_per_group, slots);
    w.slots = ceil_div(w.tiles_per_group, w.tiles_per_slot);
  } else {
    w.slots = w.tiles_per_group;
    w.tiles_per_slot = 1;
  }
  w.blocks = std::min(p.batch * p.groups * w.slots, kMaxGridBlocks);
  return w;
}

}  // namespace

Force parse_force(const char* value) {
  if (value == nullptr) return Force::none;
  if (std::strcmp(value, "warp") == 0) return Force::warp;
  if (std::strcmp(value, "ts") == 0) return Force::ts;
  return Force::none;
}

const Overrides& env_overrides() {
  static const Overrides o{parse_force(std::getenv("SELSCAN_FWD_KERNEL")),
                           parse_force(std::getenv("SELSCAN_BWD_KERNEL")),
                           parse_decode_force(std::getenv("SELSCAN_DECODE_KERNEL"))};
  return o;
}

SmemClass smem_class(int64_t smem_optin) {
  if (smem_optin >= kLargeSmemOptin) return SmemClass::large;
  return smem_optin >= kMediumSmemOptin ? SmemClass::medium : SmemClass::small;
}

Status plan_fwd(const Problem& p, const DeviceProps& dev, Force force, FwdPlan* out) {
  FwdPlan plan;
  int64_t blocks = 0;
  int per_block = 0;
  // Serving calls follow the dense rules, in the thread-states kernel's serving instances (4 blocks per SM,
  // fwd_ts_plan), 1.4-2.3x the warp-scan kernel's
  // serving variant on the H200 (validation/gpu-runs.md, run 78). Block mode only with a block size the warp-scan
  // kernel's aligned instance takes (a multiple of its 16 steps per lane): the thread-states kernel serves the
  // sequences that instance would (context a multiple of 16) and the warp-scan unaligned instance the others,
  // launched after it (its plan below). For a packed call batch counts the sequences and seqlen their total length:
  // the grid is sequences x groups x channel tiles, and the plan's other numbers do not depend on the length.
  const bool block_mode = p.serving && p.block_size > 0;
  const bool ts_blocks_ok = !block_mode || p.block_size % fwd_warp::kItemsReal == 0;
  if (force != Force::warp && ts_blocks_ok && fwd_ts_plan(p, dev, force == Force::ts, &plan.ts)) {
    plan.kernel = Kernel::ts;
    blocks = plan.ts.blocks;
    per_block = plan.ts.shape.ch;
    if (block_mode) plan.warp = fwd_warp_plan(p);
  } else {
    plan.kernel = Kernel::warp;
    plan.warp = fwd_warp_plan(p);
    blocks = plan.warp.blocks;
    per_block = plan.warp.warps;
  }
  if (blocks > kMaxGridBlocks) return too_many_blocks("forward", per_block);
  // Every kernel the call launches must fit the device's shared memory: the chosen one, and beside the thread-states
  // kernel in block mode the warp-scan unaligned instance.
  const bool launches_warp = plan.kernel == Kernel::warp || block_mode;
  if (plan.kernel == Kernel::ts && static_cast<int64_t>(plan.ts.smem) > dev.smem_optin)
    return smem_over_limit("forward (thread-states kernel)", plan.ts.smem, dev);
  if (launches_warp && static_cast<int64_t>(plan.warp.smem) > dev.smem_optin)
    return smem_over_limit("forward (warp-scan kernel)", plan.warp.smem, dev);
  *out = plan;
  return SELSCAN_STATUS_SUCCESS;
}

// The thread-states backward's copy-engine instance (kernels/bwd/ts.cuh): code made for sm_90, room for its static
// shared memory beside the dynamic part, and every tensor map the call needs within the copy engine's limits (in
// practice: rows that start on 16 bytes, L a multiple of 8 for 16-bit itypes, of 4 for fp32). The instance then
// copies no tile itself (B5 in validation/optimisation-log.md: -7.5% on issue #20's bf16 rows on the H200).
namespace {
bool bwd_copy_engine(const Problem& p, const DeviceProps& dev, size_t smem) {
  if (!copy_engine_arch(dev.ptx) ||
      static_cast<int64_t>(smem) + bwd_ts::kTmaStaticSmem > dev.smem_optin)
    return false;
  TileMapSpec specs[kBwdTileMaps];
  bwd_tile_map_specs(p, specs);
  for (const TileMapSpec& s : specs)
    if (s.base != nullptr && !tile_map_fits(s)) return false;
  return true;
}
}  // namespace

Status plan_bwd(const Problem& p, const DeviceProps& dev, Force force, BwdPlan* out) {
  BwdPlan pl;
  const int64_t wsz = p.is_complex ? 2 : 1;
  const int nvar = (p.var_B ? 1 : 0) + (p.var_C ? 1 : 0);
  pl.nacc = 1;
  if (!p.var_B) pl.accB = pl.nacc++;
  if (!p.var_C) pl.accC = pl.nacc++;
  // Deterministic variable dB/dC: one image per slot (warp-scan) or per 32-channel tile (thread-states), each stored
  // whole by one block; the conversion adds the images in order.
  pl.det_var = p.deterministic && nvar > 0;
  const SmemClass cls = smem_class(dev.smem_optin);
  size_t smem = 0;
  if (force != Force::warp && !p.serving && bwd_ts_plan(p, cls, force == Force::ts, &pl.ts)) {
    pl.kernel = Kernel::ts;
    pl.images = pl.det_var ? pl.ts.tiles : 1;
    smem = pl.ts.smem;
    pl.ts.copy_engine = bwd_copy_engine(p, dev, smem);
  } else {
    pl.kernel = Kernel::warp;
    pl.warp = bwd_warp_plan(p, cls, pl.nacc, nvar, pl.det_var);
    pl.images = pl.det_var ? pl.warp.slots : 1;
    smem = pl.warp.smem;
  }
  if (static_cast<int64_t>(smem) > dev.smem_optin)
    return smem_over_limit(pl.kernel == Kernel::ts ? "backward (thread-states kernel)" : "backward (warp-scan kernel)",
                           smem, dev);

  // Workspace: per-(b,d) partials of the per-state sums [nacc][Bt][D][N] (weights-typed) and of dD, ddelta_bias
  // [2][Bt][D]; the variable dB, dC images [images][rows][G][N][Lp] (rows: 1 for packed sequences); the
  // thread-states kernel's tile checkpoints.
  pl.var_row = (p.seqlen * wsz + 3) / 4 * 4;
  pl.var_elems = p.rows() * p.groups * p.dstate * pl.var_row;
  const size_t img = static_cast<size_t>(pl.var_elems) * sizeof(float) * static_cast<size_t>(pl.images);
  size_t off = 0;
  pl.off_pw = off;
  off = align_up(off + static_cast<size_t>(pl.nacc) * p.batch * p.dim * p.dstate * wsz * sizeof(float));
  pl.off_ps = off;
  off = align_up(off + 2 * static_cast<size_t>(p.batch * p.dim) * sizeof(float));
  pl.off_vb = off;
  if (p.var_B) off = align_up(off + img);
  pl.off_vc = off;
  if (p.var_C) off = align_up(off + img);
  // Summed with atomics, so they start at 0: both images (adjacent) with one memset.
  if (nvar > 0 && !pl.det_var) pl.zero_bytes = (p.var_C ? pl.off_vc : pl.off_vb) + img - pl.off_vb;
  if (pl.kernel == Kernel::ts) {
    pl.off_ck = off;
    off = align_up(off + pl.ts.ck_bytes);
  }
  pl.total = off;
  *out = pl;
  return SELSCAN_STATUS_SUCCESS;
}

// ------------------------------------------------------------------------------------------- conv1d
// The causal conv1d's kernels (kernels/conv1d/): a row kernel for channel-first tensors (and, without vector IO, any
// strides), a channel-last kernel, the decode update. validation/optimisation-log.md ("conv1d") has the reasoning.
namespace {

// Channel-last: the longest per-thread walk (steps) whose grid either fits one wave of resident threads (forward 6
// blocks of 128 per SM, backward 5: the kernels' launch bounds) and fills at least 3/4 of it, or has this many
// threads per SM, about 1.6 waves, so the last wave's tail costs little (design choice; a walk re-reads the W-1
// steps before it, and the backward's the W-1 after it). Short rows take walks down to 4 steps: more, shorter walks
// are what a latency-bound call needs.
constexpr int64_t kConv1dClFwdResidentPerSm = 6 * 128;
constexpr int64_t kConv1dClBwdResidentPerSm = 5 * 128;
constexpr int64_t kConv1dClFwdThreadsPerSm = 1280;
constexpr int64_t kConv1dClBwdThreadsPerSm = 1024;
constexpr int64_t kConv1dClChunks[] = {64, 32, 16, 8, 4};
// A one-row backward whose walks would be at most this long takes one time tile (plan.direct).
constexpr int64_t kConv1dClDirectChunk = 16;

// Vector IO of `items` consecutive elements along the unit-stride dim of `v` (a (rows, D, L) tensor of dtype t):
// base and every stride of a dim of size > 1 but `unit` on the vector's boundary (items * element bytes, at most
// 16: wider runs are several 16-byte vectors).
bool conv1d_vec_view(const View& v, Dtype t, const int64_t (&sizes)[3], int unit, int items) {
  const uint64_t e = static_cast<uint64_t>(real_bytes(t));
  const uint64_t align = std::min<uint64_t>(16, e * static_cast<uint64_t>(items));
  if (reinterpret_cast<uintptr_t>(v.p) % align != 0) return false;
  // Unsigned: a size-1 dim may carry any stride, and the residue survives the wrap (2^64 is a multiple of 16).
  for (int i = 0; i < 3; ++i)
    if (i != unit && sizes[i] > 1 && (static_cast<uint64_t>(v.s[i]) * e) % align != 0) return false;
  return true;
}

// The views the main kernel streams: x and out (forward), x, dout and dx (backward); channel-last runs also need
// whole vectors of channels.
bool conv1d_vec_ok(const Conv1d& p, bool bwd, int unit, int items) {
  const int64_t sizes[3] = {p.rows(), p.dim, p.seqlen};
  if (unit == 1 && p.dim % items != 0) return false;
  if (!conv1d_vec_view(p.x, p.itype, sizes, unit, items)) return false;
  if (!bwd) return conv1d_vec_view(p.out, p.itype, sizes, unit, items);
  return conv1d_vec_view(p.dout, p.itype, sizes, unit, items) && conv1d_vec_view(p.dx, p.itype, sizes, unit, items);
}

// The main kernel's shape; false when its grid would exceed CUDA's.
bool conv1d_shape(const Conv1d& p, const DeviceProps& dev, bool bwd, Conv1dPlan* pl) {
  using namespace cuda::conv1d;
  const int64_t rows = p.rows();
  pl->threads = kThreads;
  if (p.layout == Layout::channel_last) {
    pl->kernel = Conv1dKernel::cl;
    pl->items = bwd ? kClBwdItems : kItems;
    pl->vec = conv1d_vec_ok(p, bwd, 1, pl->items);
    pl->row_threads = bwd ? kClBwdLanes : kClLanes;
    const int64_t groups = kThreads / pl->row_threads;  // time groups a block
    const int64_t lanes = rows * ceil_div(p.dim, pl->items);
    const int64_t sms = std::max(dev.sms, 1);
    const int64_t want = (bwd ? kConv1dClBwdThreadsPerSm : kConv1dClFwdThreadsPerSm) * sms;
    const int64_t wave = (bwd ? kConv1dClBwdResidentPerSm : kConv1dClFwdResidentPerSm) * sms;
    const int64_t shortest = kConv1dClChunks[std::size(kConv1dClChunks) - 1];
    pl->chunk = shortest;
    for (int64_t c : kConv1dClChunks) {
      const int64_t threads = lanes * ceil_div(p.seqlen, c);
      if (threads >= want || (threads <= wave && 4 * threads >= 3 * wave)) {
        pl->chunk = c;
        break;
      }
    }
    // A one-row backward short enough for one block's walks takes one time tile: one part per channel, which the
    // main kernel writes itself (no finalize launch, about as long as such a call's whole kernel).
    if (bwd && rows == 1 && p.seqlen <= groups * kConv1dClDirectChunk)
      pl->chunk = std::max(shortest, ceil_div(ceil_div(p.seqlen, groups), 4) * 4);
    pl->tiles = ceil_div(p.seqlen, pl->chunk * groups);
    pl->blocks = rows * ceil_div(p.dim, int64_t{pl->row_threads} * pl->items) * pl->tiles;
  } else {
    pl->kernel = Conv1dKernel::rows;
    pl->items = row_items(p.itype, bwd ? p.plain_bwd() : p.plain_fwd());
    pl->vec = p.layout == Layout::channel_first && conv1d_vec_ok(p, bwd, 2, pl->items);
    int rt = 1;
    while (rt < kThreads && int64_t{rt} * pl->items < p.seqlen) rt *= 2;
    pl->row_threads = rt;
    pl->chunk = static_cast<int64_t>(rt) * pl->items;
    pl->tiles = ceil_div(p.seqlen, pl->chunk);
    pl->blocks = ceil_div(rows * p.dim, kThreads / rt) * pl->tiles;
  }
  // No packed sequence: no step belongs to one (the kernels would look up cu_seqlens[1]).
  if (p.varlen && p.batch == 0) pl->blocks = 0;
  return pl->blocks <= kMaxGridBlocks;
}

Status conv1d_too_many_blocks(const char* what, int64_t blocks) {
  return fail(SELSCAN_STATUS_UNSUPPORTED, std::string(what) + ": the call needs " + std::to_string(blocks) +
                                              " blocks, above the CUDA grid limit (2^31 - 1)");
}

// Packed calls tag steps with their sequence number in 32 bits (kernels/conv1d/).
Status conv1d_check_batch(const Conv1d& p, const char* what) {
  if (!p.varlen || p.batch <= INT32_MAX) return SELSCAN_STATUS_SUCCESS;
  return fail(SELSCAN_STATUS_UNSUPPORTED, std::string(what) + ": cu_seqlens holds " + std::to_string(p.batch) +
                                              " sequences, the CUDA kernels serve at most 2^31 - 1");
}

}  // namespace

Status plan_conv1d_fwd(const Conv1d& p, const DeviceProps& dev, Conv1dPlan* out) {
  if (Status s = conv1d_check_batch(p, "conv1d forward"); s != SELSCAN_STATUS_SUCCESS) return s;
  Conv1dPlan pl;
  if (!conv1d_shape(p, dev, false, &pl)) return conv1d_too_many_blocks("conv1d forward", pl.blocks);
  pl.states = p.fin.present() || p.conv_states.present();
  *out = pl;
  return SELSCAN_STATUS_SUCCESS;
}

Status plan_conv1d_bwd(const Conv1d& p, const DeviceProps& dev, Conv1dPlan* out) {
  if (Status s = conv1d_check_batch(p, "conv1d backward"); s != SELSCAN_STATUS_SUCCESS) return s;
  Conv1dPlan pl;
  if (!conv1d_shape(p, dev, true, &pl)) return conv1d_too_many_blocks("conv1d backward", pl.blocks);
  pl.states = p.dinit.present();
  // Every block of a row (channel-first: rows of channels that share a block are summed apart) or of a channel
  // tile (channel-last) leaves one partial per channel: [parts][W + 1][D] floats (dweight's W, then dbias), which
  // the finalize kernel sums in a fixed order.
  pl.parts = p.rows() * pl.tiles;
  pl.direct = pl.parts == 1 && pl.blocks > 0;
  pl.workspace = pl.direct ? 0
                           : align_up(static_cast<size_t>(pl.parts) * static_cast<size_t>(p.width + 1) *
                                      static_cast<size_t>(p.dim) * sizeof(float));
  *out = pl;
  return SELSCAN_STATUS_SUCCESS;
}

Status plan_conv1d_update(const Conv1dUpdate& p, const DeviceProps& dev, Conv1dPlan* out) {
  (void)dev;
  Conv1dPlan pl;
  pl.kernel = Conv1dKernel::update;
  pl.threads = cuda::conv1d::kThreads;
  pl.tiles = ceil_div(p.dim, pl.threads);  // channel blocks per sequence
  pl.blocks = pl.tiles * p.batch;
  if (pl.blocks > kMaxGridBlocks) return conv1d_too_many_blocks("conv1d update", pl.blocks);
  *out = pl;
  return SELSCAN_STATUS_SUCCESS;
}

// ---------------------------------------------------------------- the decode step (kernels/decode/)
namespace {

// 16-byte loads of a lane's kStatesPerLane consecutive elements: unit last stride, whole lanes, and the base and
// every other stride (`n` of them) on 16-byte boundaries.
bool vec_ok(const void* base, Dtype t, int64_t dstate, int64_t last_stride, const int64_t* strides, int n) {
  constexpr int kLane = StateUpdatePlan::kStatesPerLane;
  const int64_t e = real_bytes(t);
  if (last_stride != 1 || dstate % kLane != 0 || (kLane * e) % 16 != 0) return false;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  // Unsigned: a size-1 dim may carry any stride, and the product's residue mod 16 survives the wrap (2^64 is a
  // multiple of 16).
  for (int i = 0; i < n; ++i)
    if ((static_cast<uint64_t>(strides[i]) * static_cast<uint64_t>(e)) % 16 != 0) return false;
  return true;
}

// kLean's loads of a lane's `states` consecutive elements (8 or 16 bytes: one load; A's 32 with 8 states, two):
// unit last stride, whole lanes, and the base and every other stride on the load's boundary.
bool lane_vec_ok(const void* base, Dtype t, int64_t dstate, int states, int64_t last_stride, const int64_t* strides,
                 int n) {
  const int64_t bytes = states * real_bytes(t);
  const uint64_t align = static_cast<uint64_t>(bytes < 16 ? bytes : 16);
  if (last_stride != 1 || dstate % states != 0) return false;
  if (reinterpret_cast<uintptr_t>(base) % align != 0) return false;
  for (int i = 0; i < n; ++i)  // unsigned, as in vec_ok (align divides 2^64)
    if ((static_cast<uint64_t>(strides[i]) * static_cast<uint64_t>(real_bytes(t))) % align != 0) return false;
  return true;
}

// The lean kernel's plan, when the call is its case (see StateUpdatePlan), with `states` states a lane (kSmall's 4
// too); false otherwise.
bool plan_lean(const StateUpdate& p, StateUpdatePlan* plan, int states = StateUpdatePlan::kLeanStates) {
  // Every state dtype: with 8 states (32 bytes of fp32, 16 of 16-bit) a lane the lean kernel beat the general one
  // on every measured decode cell, fp32 state included (run 53, H200, Mamba-2 Bt 64: 89 us against 134; 91% of the
  // copy floor; validation/optimisation-log.md).
  // One sequence a block row: grid.y's limit bounds the batch (larger batches loop in the general kernel).
  if (p.tokens != 1 || p.batch > 65535 || p.dstate % states != 0) return false;
  // A lane's B and C in one 16-byte load: 16-bit B and C only.
  if (p.B_t == Dtype::f32 || p.C_t == Dtype::f32) return false;
  const int64_t lanes = p.dstate / states;
  if (lanes > 32 || (lanes & (lanes - 1)) != 0) return false;
  if (!lane_vec_ok(p.state, p.state_t, p.dstate, states, p.sstate[3], p.sstate, 3) ||
      !lane_vec_ok(p.B, p.B_t, p.dstate, states, p.sB[3], p.sB, 3) ||
      !lane_vec_ok(p.C, p.C_t, p.dstate, states, p.sC[3], p.sC, 3))
    return false;
  const bool a_const = p.sA[2] == 0;
  if (!a_const && !lane_vec_ok(p.A, Dtype::f32, p.dstate, states, p.sA[2], p.sA, 2)) return false;
  plan->kernel = StateUpdatePlan::kLean;
  plan->lanes = static_cast<int>(lanes);
  plan->lane_bits = 0;
  while ((1 << plan->lane_bits) < lanes) ++plan->lane_bits;
  plan->vec_state = plan->vec_B = plan->vec_C = true;
  plan->vec_A = !a_const;
  plan->a_const = a_const;
  return true;
}

// Whether every element a channel touches lies within 2^32 elements of its row: the largest (h, p) offset
// sum_i (count_i - 1) * stride_i (strides >= 0, validated; a dim of one element adds nothing whatever its stride).
bool offsets_fit_u32(std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  uint64_t sum = 0;
  for (const auto& [count, stride] : dims) {
    if (count <= 1) continue;
    const auto c = static_cast<uint64_t>(count - 1), st = static_cast<uint64_t>(stride);
    if (st != 0 && c > UINT32_MAX / st) return false;
    sum += c * st;
    if (sum > UINT32_MAX) return false;
  }
  return true;
}

// kSmall over a lean plan (`plan`, its lanes for 8 states): false where a channel's offsets need 64 bits, or `states`
// (4) leaves the lane count outside a warp or the loads' alignment.
bool plan_small(const StateUpdate& p, int states, StateUpdatePlan* plan) {
  const int64_t H = p.heads, P = p.headdim, N = p.dstate;
  const bool fits =
      offsets_fit_u32({{H, p.sx[2]}, {P, p.sx[3]}}) && offsets_fit_u32({{H, p.sdt[2]}, {P, p.sdt[3]}}) &&
      offsets_fit_u32({{H, p.sout[2]}, {P, p.sout[3]}}) &&
      (p.z == nullptr || offsets_fit_u32({{H, p.sz[2]}, {P, p.sz[3]}})) &&
      offsets_fit_u32({{p.groups, p.sB[2]}, {N, p.sB[3]}}) && offsets_fit_u32({{p.groups, p.sC[2]}, {N, p.sC[3]}}) &&
      offsets_fit_u32({{H, p.sA[0]}, {P, p.sA[1]}, {N, p.sA[2]}}) &&
      (p.D == nullptr || offsets_fit_u32({{H, p.sD[0]}, {P, p.sD[1]}})) &&
      (p.dt_bias == nullptr || offsets_fit_u32({{H, p.sbias[0]}, {P, p.sbias[1]}})) &&
      offsets_fit_u32({{H, p.sstate[1]}, {P, p.sstate[2]}, {N, p.sstate[3]}});
  // The row strides too (kSmall's parameter block holds every stride in 32 bits; the products with the sequence or
  // slot index stay 64-bit): each one of a dimension with more than one entry.
  const auto row_fits = [](int64_t count, int64_t stride) { return count <= 1 || stride <= int64_t{UINT32_MAX}; };
  const int64_t rows = p.batch, slots = p.slots > p.batch ? p.slots : p.batch;
  const bool rows_fit = row_fits(slots, p.sstate[0]) && row_fits(rows, p.sx[0]) && row_fits(rows, p.sdt[0]) &&
                        row_fits(rows, p.sout[0]) && (p.z == nullptr || row_fits(rows, p.sz[0])) &&
                        row_fits(rows, p.sB[0]) && row_fits(rows, p.sC[0]) &&
                        (p.idx == nullptr || row_fits(rows, p.sidx)) && (p.dst == nullptr || row_fits(rows, p.sdst));
  if (!fits || !rows_fit) return false;
  StateUpdatePlan q = *plan;
  if (states != StateUpdatePlan::kLeanStates && !plan_lean(p, &q, states)) return false;
  q.kernel = StateUpdatePlan::kSmall;
  q.small_states = states;
  fast_divisor(static_cast<uint32_t>(P), &q.p_mul, &q.p_shift);
  fast_divisor(static_cast<uint32_t>(p.heads_per_group), &q.g_mul, &q.g_shift);
  *plan = q;
  return true;
}

}  // namespace

// The lean kernel where the call allows it: a thread per (sequence, channel, 8 states), few registers and many
// resident threads, as mamba_ssm's Triton kernel; for a small grid its short-path form (kSmall). Otherwise the
// general kernel: 8 states a lane (32 bytes of fp32 state, 16 of 16-bit, a sequence), several sequences a thread
// (kernels/decode/state_update.cu).
DecodeForce parse_decode_force(const char* value) {
  if (value == nullptr) return DecodeForce::none;
  if (std::strcmp(value, "lean") == 0) return DecodeForce::lean;
  if (std::strcmp(value, "general") == 0) return DecodeForce::general;
  if (std::strcmp(value, "small") == 0) return DecodeForce::small;
  if (std::strcmp(value, "small4") == 0) return DecodeForce::small4;
  return DecodeForce::none;
}

StateUpdatePlan plan_state_update(const StateUpdate& p) { return plan_state_update(p, env_overrides().decode); }

StateUpdatePlan plan_state_update(const StateUpdate& p, DecodeForce force) {
  StateUpdatePlan plan{};
  if (force != DecodeForce::general && plan_lean(p, &plan)) {
    const bool small_grid = p.batch * p.channels() * p.dstate <= StateUpdatePlan::kSmallGridStates;
    if (force == DecodeForce::small4 && plan_small(p, 4, &plan)) return plan;
    if (force == DecodeForce::small || force == DecodeForce::small4 || (force == DecodeForce::none && small_grid))
      plan_small(p, StateUpdatePlan::kLeanStates, &plan);  // where the offsets need 64 bits, the lean plan stays
    return plan;
  }
  plan.kernel = StateUpdatePlan::kGeneral;
  const int64_t chunks = (p.dstate + StateUpdatePlan::kStatesPerLane - 1) / StateUpdatePlan::kStatesPerLane;
  plan.lanes = 1;
  plan.lane_bits = 0;
  while (plan.lanes < chunks) {  // chunks <= 32 for dstate <= 256
    plan.lanes <<= 1;
    ++plan.lane_bits;
  }
  plan.vec_state = vec_ok(p.state, p.state_t, p.dstate, p.sstate[3], p.sstate, 3);
  plan.vec_A = vec_ok(p.A, Dtype::f32, p.dstate, p.sA[2], p.sA, 2);
  plan.vec_B = vec_ok(p.B, p.B_t, p.dstate, p.sB[3], p.sB, 3);
  plan.vec_C = vec_ok(p.C, p.C_t, p.dstate, p.sC[3], p.sC, 3);
  return plan;
}

}  // namespace selscan::cuda
