// Runs posattn's torch-free CUDA launchers (csrc/cuda/) on one case read from
// files, and writes what they computed: the simulated-GPU test harness
// (tests/cuda_sim/test_cuda_sim.py makes the cases and checks the results
// against posattn.reference). No torch: plain CUDA runtime calls, so the
// binary runs on GPGPU-Sim (../shared/gpusim) as well as on a real GPU.
//
//   harness CASE_DIR
//
// CASE_DIR/case.txt holds one "key value..." line per setting (see read_case);
// the arrays are raw little-endian files NAME.bin in the element type (int64
// for index, float64 for sigma, the accumulation type for glse). Outputs are
// written beside them as NAME.out.bin, and CASE_DIR/result.txt gets
// "key value" lines (the determinism check). Exit status 0 on success; a CUDA
// error prints its name and exits 3.
//
// Built once per element type (-DHARNESS_T=float|double|half|bf16) and, for the
// fast kernels, head dim (-DHARNESS_FAST_D=32|64|128) and kind of call
// (-DPOSATTN_FAST_INSTANCES=1 single-grid, 2 packed), so that each binary holds only
// the kernels it runs (the simulator runs ptxas on, and parses, all of its PTX at
// every start: up to 30 MB for one type and head dim with both kinds).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <type_traits>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/apply_maps.cuh"
#include "cuda/relpos_general.cuh"
#include "cuda/relpos_plan.cuh"
#if defined(HARNESS_FAST_D)
#include "cuda/relpos_fast_forward.cuh"
#include "cuda/relpos_fast_tables.cuh"
#include "cuda/relpos_fast_backward.cuh"
#include "cuda/relpos_fast_offsets.cuh"
#endif

#if !defined(HARNESS_T)
#error "build with -DHARNESS_T=float|double|half|bf16"
#endif
#define HARNESS_float float
#define HARNESS_double double
#define HARNESS_half __half
#define HARNESS_bf16 __nv_bfloat16
#define HARNESS_CAT(a, b) a##b
#define HARNESS_TYPE(t) HARNESS_CAT(HARNESS_, t)
using T = HARNESS_TYPE(HARNESS_T);
using Acc = posattn::cuda::acc_t<T>;

namespace {

using Case = std::map<std::string, std::vector<std::string>>;
std::string g_dir;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "harness: %s\n", what.c_str());
  std::exit(2);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    // (cudaGetErrorName is not implemented by the simulator)
    std::fprintf(stderr, "harness: CUDA error %d in %s: %s\n", static_cast<int>(err), what,
                 cudaGetErrorString(err));
    std::exit(3);
  }
}

Case read_case(const std::string& dir) {
  std::ifstream in(dir + "/case.txt");
  if (!in) fail("cannot read " + dir + "/case.txt");
  Case c;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key, v;
    if (!(ls >> key)) continue;
    std::vector<std::string>& vals = c[key];
    while (ls >> v) vals.push_back(v);
  }
  return c;
}

bool has(const Case& c, const std::string& k) {
  return c.count(k) > 0;
}
int64_t geti(const Case& c, const std::string& k, int64_t dflt = 0) {
  auto it = c.find(k);
  return it == c.end() || it->second.empty() ? dflt : std::stoll(it->second[0]);
}
double getd(const Case& c, const std::string& k, double dflt = 0.0) {
  auto it = c.find(k);
  return it == c.end() || it->second.empty() ? dflt : std::stod(it->second[0]);
}
std::vector<int64_t> getv(const Case& c, const std::string& k) {
  std::vector<int64_t> out;
  auto it = c.find(k);
  if (it != c.end())
    for (const std::string& s : it->second) out.push_back(std::stoll(s));
  return out;
}

template <typename E>
std::vector<E> read_array(const std::string& name, size_t count) {
  std::vector<E> v(count);
  std::ifstream in(g_dir + "/" + name + ".bin", std::ios::binary);
  if (!in) fail("cannot read " + name + ".bin");
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(E)));
  if (static_cast<size_t>(in.gcount()) != count * sizeof(E)) fail(name + ".bin is shorter than expected");
  return v;
}

template <typename E>
void write_array(const std::string& name, const std::vector<E>& v) {
  std::ofstream out(g_dir + "/" + name + ".out.bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(E)));
  if (!out) fail("cannot write " + name + ".out.bin");
}

// A device buffer of `count` elements (none for count 0: a null pointer).
template <typename E>
struct Dev {
  E* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count = 0) : n(count) {
    if (n) check(cudaMalloc(&p, n * sizeof(E)), "cudaMalloc");
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p) cudaFree(p);
  }
  void upload(const std::vector<E>& v) {
    if (n) check(cudaMemcpy(p, v.data(), n * sizeof(E), cudaMemcpyHostToDevice), "upload");
  }
  void zero() {
    if (n) check(cudaMemset(p, 0, n * sizeof(E)), "cudaMemset");
  }
  // filled with the byte 0xA5 (about -2.9e-16 in float32, -0.022 in float16): an output the
  // kernel fails to write shows as a wrong finite value (a NaN pattern could hide among NaN results)
  void poison() {
    if (n) check(cudaMemset(p, 0xa5, n * sizeof(E)), "cudaMemset");
  }
  std::vector<E> download() const {
    std::vector<E> v(n);
    if (n) check(cudaMemcpy(v.data(), p, n * sizeof(E), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

template <typename E>
void load(Dev<E>& d, const std::string& name) {
  if (d.n) d.upload(read_array<E>(name, d.n));
}

float host_float(float x) {
  return x;
}
double host_float(double x) {
  return x;
}
float host_float(__half x) {
  return __half2float(x);
}
float host_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// ---- relpos_attention ------------------------------------------------------

namespace rp = posattn::relpos;

// A case's call, and the plans of its forward and backward as the extension makes
// them (cuda/relpos_plan.cuh) for the device the case names: `smem_optin` (the
// opt-in shared memory of the GPU the case plans for: the simulator's own limit is
// not a real device's) and `request` (POSATTN_CUDA_KERNEL: auto, general or fast).
struct RelposRun {
  posattn::RelposParams p;
  rp::DType dtype;
  rp::CudaPlan fwd, bwd;
  bool backward = false;
  int repeats = 1;
};

rp::DType harness_dtype() {
  if (std::is_same<T, double>::value) return rp::DType::kFloat64;
  if (std::is_same<T, float>::value) return rp::DType::kFloat32;
  if (std::is_same<T, __half>::value) return rp::DType::kFloat16;
  return rp::DType::kBFloat16;
}

RelposRun relpos_setup(const Case& c) {
  posattn::RelposShape s;
  s.B = geti(c, "B");
  s.H = geti(c, "H");
  s.D = geti(c, "D");
  s.Dv = geti(c, "Dv");
  s.grid = getv(c, "grid");
  s.N = 1;
  for (int64_t n : s.grid) s.N *= n;
  if (has(c, "packed_offsets")) {  // a packed call: grid is max_grid, T tokens, S samples
    s.N = geti(c, "T");
    s.packed_samples = static_cast<int64_t>(getv(c, "packed_offsets").size()) - 1;
    if (s.N < 1 || s.packed_samples < 1 || s.B != 1)
      fail("a packed case needs T >= 1, S >= 1 samples and B = 1");
  }
  s.has_pos = geti(c, "has_pos") != 0;
  s.has_sigma = geti(c, "has_sigma") != 0;
  s.has_bias = geti(c, "has_bias") != 0;
  s.mode = geti(c, "multiply") != 0 ? posattn::SpanMode::kMultiply : posattn::SpanMode::kAdd;
  if (has(c, "window")) s.set_symmetric_window(getv(c, "window"));
  if (has(c, "window_left")) {  // NATTEN's vocabulary: per axis cells before / after, stride, causal
    s.window_left = getv(c, "window_left");
    s.window_right = getv(c, "window_right");
    s.window_stride = getv(c, "window_stride");
    s.window_causal = getv(c, "window_causal");
  }
  s.window_shift = geti(c, "window_shift") != 0;
  RelposRun r;
  r.p = posattn::make_relpos_params(s, getd(c, "threshold"), getd(c, "scale", 1.0), geti(c, "causal") != 0);
  r.dtype = harness_dtype();
  r.backward = geti(c, "backward") != 0;
  r.repeats = static_cast<int>(geti(c, "repeats", 1));
  const std::string req = has(c, "request") ? c.at("request").at(0) : "auto";
  if (req != "auto" && req != "general" && req != "fast") fail("request must be auto, general or fast");
  const rp::KernelRequest request = req == "general" ? rp::KernelRequest::kGeneral
                                    : req == "fast"  ? rp::KernelRequest::kFast
                                                     : rp::KernelRequest::kAuto;
  rp::CudaDevice dev;
  dev.smem_optin = static_cast<size_t>(geti(c, "smem_optin"));
  dev.tensor_cores = true;  // built for compute_80
  dev.allow_tf32 = true;    // float32 cases ask for the fast path through TF32
  r.fwd = rp::plan_cuda(r.p, r.dtype, false, true, request, dev);
  r.bwd = rp::plan_cuda(r.p, r.dtype, true, true, request, dev);
  // a benchmark's comparison (benchmarks/sim_cycles.py): the general offset kernel instead of the plan's
  if (geti(c, "general_offsets") != 0) r.bwd.offsets = rp::CudaPlan::Kernels::kGeneral;
  if (r.bwd.offsets == rp::CudaPlan::Kernels::kGeneral)
    r.bwd.dsig_partials = posattn::relpos::cuda_general::offset_blocks_per_head(r.p);
  if (!r.fwd.error.empty()) fail("the plan refuses the forward: " + r.fwd.error);
  if (r.backward && !r.bwd.error.empty()) fail("the plan refuses the backward: " + r.bwd.error);
  // (the simulator enforces no opt-in limit: the device's is checked here, and by the launchers)
  if (r.fwd.smem > dev.smem_optin || (r.backward && r.bwd.smem > dev.smem_optin))
    fail("the plan needs more shared memory per block than the case's device has");
  return r;
}

// The fast kernels of this binary's head dim for a plan that takes them.
void check_fast_dim(const posattn::RelposParams& p) {
#if defined(HARNESS_FAST_D)
  if (p.D != HARNESS_FAST_D)
    fail("this harness runs the fast kernels with D = " + std::to_string(HARNESS_FAST_D));
#else
  (void)p;
  fail("this harness has no fast kernels (build with -DHARNESS_FAST_D)");
#endif
}

// The entry point's steps for the fast kernels' forward or backward (relpos/relpos_cuda.cu,
// launch_fast; with `offsets`, the fast offset kernel too, or alone with `offsets_only`): the
// per-offset tables, then the kernels, with the tables in t meanwhile.
// The layouts follow the case's device (`optin`: its smem_optin).
void run_fast(const posattn::RelposParams& p, posattn::RelposTensors<T>& t, size_t optin, bool backward,
              bool offsets, bool offsets_only = false) {
#if defined(HARNESS_FAST_D)
  if constexpr (!std::is_same<T, double>::value) {  // (float: through TF32)
    namespace fast = rp::cuda_fast;
    if (p.packed_samples > 0 ? !fast::kPackedInstances : !fast::kSingleGridInstances)
      fail(std::string("this harness holds the fast kernels of ") +
           (fast::kPackedInstances ? "packed" : "single-grid") +
           " calls only (-DPOSATTN_FAST_INSTANCES: simlib.harness(..., packed=))");
    const int64_t len = p.H * fast::offset_table_len<T>(p);
    Dev<float> add(fast::has_offset_add(p) ? len : 0), mul(fast::has_offset_mul(p) ? len : 0);
    t.offset_add = add.p;
    t.offset_mul = mul.p;
    Dev<int> tiles(p.packed_samples > 0 ? rp::cuda_packed::packed_schedule_ints(p)
                                        : 0);  // (a packed call's schedule)
    tiles.poison();
    t.packed_tiles = tiles.p;
    check(fast::launch_offset_tables<T>(p, t, add.p, mul.p, nullptr), "offset tables launch");
    if (backward && !offsets_only)
      check(fast::launch_fast_backward_call<T, HARNESS_FAST_D>(p, t, optin, nullptr), "fast backward launch");
    if (backward && offsets)
      check(fast::launch_fast_offsets_by_rank<T, HARNESS_FAST_D>(p, t, optin, nullptr),
            "fast offsets launch");
    if (!backward)
      check(fast::launch_fast_forward_call<T, HARNESS_FAST_D>(p, t, optin, nullptr), "fast forward launch");
    check(cudaDeviceSynchronize(), backward ? "fast backward" : "fast forward");  // (before the tables go)
    if (!backward && p.packed_samples > 0) write_array("schedule", tiles.download());  // (prefix, order)
    t.offset_add = t.offset_mul = nullptr;
    t.packed_tiles = nullptr;
    return;
  }
#endif
  (void)p, (void)t, (void)optin, (void)backward, (void)offsets, (void)offsets_only;
  fail("the plan gave the fast kernels a type they do not take");
}

int run_relpos(const Case& c) {
  using Kernels = rp::CudaPlan::Kernels;
  const RelposRun run = relpos_setup(c);
  const posattn::RelposParams& p = run.p;
  const size_t nq = p.B * p.H * p.N * p.D, nv = p.B * p.H * p.N * p.Dv, nrow = p.B * p.H * p.N;
  Dev<T> q(nq), k(nq), v(nv), qpos(p.has_pos ? nq : 0), rel(p.has_pos ? p.H * p.U * p.D : 0),
      bias(p.has_bias ? p.H * p.U : 0);
  Dev<double> sigma(p.has_sigma ? p.H * p.G_in : 0);
  load(q, "q");
  load(k, "k");
  load(v, "v");
  load(qpos, "q_pos");
  load(rel, "rel");
  load(bias, "bias");
  load(sigma, "sigma");
  Dev<T> out(nv);
  Dev<Acc> lse(nrow);  // float32 for the fast kernels' T (never double there)
  out.poison();
  lse.poison();
  posattn::RelposTensors<T> t;  // what the entry point fills (relpos/relpos_args.h)
  t.q = q.p;
  t.k = k.p;
  t.v = v.p;
  t.qpos = qpos.p;
  t.rel = rel.p;
  t.bias = bias.p;
  t.sigma = sigma.p;
  // a packed call's offsets and shapes, as the case gives them (bad ones too: the device checks them)
  std::vector<int> off_h, shp_h;
  for (int64_t x : getv(c, "packed_offsets")) off_h.push_back(static_cast<int>(x));
  for (int64_t x : getv(c, "packed_shapes")) shp_h.push_back(static_cast<int>(x));
  Dev<int> packed_offsets(off_h.size()), packed_shapes(shp_h.size());
  packed_offsets.upload(off_h);
  packed_shapes.upload(shp_h);
  t.packed_offsets = packed_offsets.p;
  t.packed_shapes = packed_shapes.p;
  t.out = out.p;
  t.lse = lse.p;
  if (run.fwd.path == Kernels::kFast) {
    check_fast_dim(p);
    run_fast(p, t, run.fwd.smem_optin, false, false);
  } else {
    check(rp::cuda_general::launch_forward<T>(p, t, nullptr), "general forward launch");
  }
  check(cudaDeviceSynchronize(), "forward");
  const std::vector<T> out_h = out.download();
  const std::vector<Acc> lse_h = lse.download();
  write_array("out", out_h);
  write_array("lse", lse_h);
  std::ofstream res(g_dir + "/result.txt");
  res << "forward " << rp::kernels_name(run.fwd.path) << "\nlayout_class " << run.fwd.layout_class << "\n";
  if (!run.fwd.forward_layout.empty()) res << "forward_layout " << run.fwd.forward_layout << "\n";
  if (!run.backward) return 0;

  // the glue's host-side work: D_i = dO_i . out_i - d lse_i
  const std::vector<T> gout_h = read_array<T>("gout", nv);
  std::vector<Acc> rowd_h(nrow, Acc(0));
  const std::vector<Acc> glse_h =
      geti(c, "has_glse") != 0 ? read_array<Acc>("glse", nrow) : std::vector<Acc>(nrow, Acc(0));
  for (size_t r = 0; r < nrow; ++r) {
    Acc s = 0;
    for (int64_t e = 0; e < p.Dv; ++e)
      s += static_cast<Acc>(host_float(gout_h[r * p.Dv + e])) *
           static_cast<Acc>(host_float(out_h[r * p.Dv + e]));
    rowd_h[r] = s - glse_h[r];
  }
  Dev<T> gout(nv);
  Dev<Acc> rowd(nrow);
  gout.upload(gout_h);
  rowd.upload(rowd_h);
  const rp::CudaPlan& plan = run.bwd;
  const bool fast_offsets = plan.has_offsets && plan.offsets == Kernels::kFast;
  Dev<float> drel_acc(fast_offsets && p.has_pos ? p.H * p.U * p.D : 0),
      dbias_acc(fast_offsets && p.has_bias ? p.H * p.U : 0);
  t.gout = gout.p;
  t.rowd = rowd.p;
  t.drel_acc = drel_acc.p;
  t.dbias_acc = dbias_acc.p;
  Dev<int> offset_order(fast_offsets ? plan.offset_order : 0);  // (zeroed by the launcher: poisoned here)
  offset_order.poison();
  t.offset_order = offset_order.p;
  const int64_t per_head = plan.dsig_partials;  // d sigma partials per head
  if (plan.path != Kernels::kGeneral || fast_offsets) check_fast_dim(p);
  std::vector<std::vector<std::vector<char>>> runs;  // per repeat, the bytes of every gradient
  const char* names[] = {"dq", "dk", "dv", "dq_pos", "drel", "dbias", "dsigma"};
  for (int rep = 0; rep < run.repeats; ++rep) {
    Dev<T> dq(nq), dk(nq), dv(nv), dqpos(p.has_pos ? nq : 0), drel(p.has_pos ? p.H * p.U * p.D : 0),
        dbias(p.has_bias ? p.H * p.U : 0);
    Dev<double> dsig_part(p.has_sigma ? p.H * per_head * p.G_in : 0);
    for (Dev<T>* d : {&dq, &dk, &dv, &dqpos, &drel, &dbias}) d->poison();
    dsig_part.zero();
    t.dq = dq.p;
    t.dk = dk.p;
    t.dv = dv.p;
    t.dqpos = dqpos.p;
    t.drel = drel.p;
    t.dbias = dbias.p;
    t.dsig_part = dsig_part.p;
#if defined(HARNESS_FAST_D)
    if constexpr (!std::is_same<T, double>::value) {
      if (plan.path == Kernels::kFast)
        run_fast(p, t, plan.smem_optin, true, fast_offsets);
      else if (fast_offsets)
        run_fast(p, t, plan.smem_optin, true, true, /*offsets_only=*/true);
    }
#endif
    if (plan.path == Kernels::kGeneral) {
      check(rp::cuda_general::launch_backward_dq<T>(p, t, nullptr), "general backward dq launch");
      check(rp::cuda_general::launch_backward_dkv<T>(p, t, nullptr), "general backward dkv launch");
    }
    if (plan.has_offsets && plan.offsets == Kernels::kGeneral)
      check(rp::cuda_general::launch_backward_offset<T>(p, t, nullptr), "backward offset launch");
    check(cudaDeviceSynchronize(), "backward");
    // d sigma: the glue sums the per-block partials over the blocks (dsig_part.sum(1))
    std::vector<double> dsigma(p.has_sigma ? p.H * p.G_in : 0, 0.0);
    if (p.has_sigma) {
      const std::vector<double> part = dsig_part.download();
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t b = 0; b < per_head; ++b)
          for (int64_t a = 0; a < p.G_in; ++a)
            dsigma[h * p.G_in + a] += part[(h * per_head + b) * p.G_in + a];
    }
    std::vector<std::vector<char>> bytes;
    auto keep = [&](const auto& vec) {
      const char* b = reinterpret_cast<const char*>(vec.data());
      bytes.emplace_back(b, b + vec.size() * sizeof(vec[0]));
    };
    keep(dq.download());
    keep(dk.download());
    keep(dv.download());
    keep(dqpos.download());
    keep(drel.download());
    keep(dbias.download());
    keep(dsigma);
    runs.push_back(bytes);
  }
  for (size_t g = 0; g < runs[0].size(); ++g) write_array(names[g], runs[0][g]);
  bool same = true;
  for (size_t r = 1; r < runs.size(); ++r) same = same && runs[r] == runs[0];
  res << "backward " << rp::kernels_name(plan.path) << "\noffsets "
      << (plan.has_offsets ? rp::kernels_name(plan.offsets) : "none") << "\nbackward_repeats " << runs.size()
      << "\nbitwise_equal " << (same ? 1 : 0) << "\n";
  if (!plan.backward_layout.empty()) res << "backward_layout " << plan.backward_layout << "\n";
  if (!plan.offsets_layout.empty()) res << "offsets_layout " << plan.offsets_layout << "\n";
  return 0;
}

// ---- apply_maps --------------------------------------------------------------

int run_apply_maps(const Case& c) {
  posattn::apply_maps::MapsShape s;
  s.B = geti(c, "B");
  s.H = geti(c, "H");
  s.N = geti(c, "N");
  s.P = geti(c, "P");
  s.A = geti(c, "A");
  s.m = geti(c, "m");
  s.D = s.A * s.m;
  s.batched_index = geti(c, "batched_index") != 0;
  const size_t nx = s.B * s.H * s.N * s.D, nmaps = s.P * s.H * s.A * s.m * s.m;
  const size_t nidx = (s.batched_index ? s.B : 1) * s.N * s.A;
  Dev<T> x(nx), maps(nmaps), y(nx), gy(nx), gx(nx);
  Dev<int64_t> index(nidx);
  Dev<Acc> gmaps(nmaps);
  load(x, "x");
  load(maps, "maps");
  load(index, "index");
  load(gy, "gy");
  y.poison();
  gx.poison();
  gmaps.zero();
  check(posattn::apply_maps::launch_apply<T>(s, x.p, maps.p, index.p, y.p, false, nullptr),
        "apply_maps launch");
  check(posattn::apply_maps::launch_apply<T>(s, gy.p, maps.p, index.p, gx.p, true, nullptr),
        "apply_maps (x^T) launch");
  check(posattn::apply_maps::launch_grad_maps<T>(s, gy.p, x.p, index.p, gmaps.p, nullptr),
        "grad maps launch");
  check(cudaDeviceSynchronize(), "apply_maps");
  write_array("y", y.download());
  write_array("gx", gx.download());
  write_array("gmaps", gmaps.download());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) fail("usage: harness CASE_DIR");
  g_dir = argv[1];
  const Case c = read_case(g_dir);
  if (!has(c, "op")) fail("case.txt has no op line");
  const std::string op = c.at("op").at(0);
  if (op == "relpos") return run_relpos(c);
  if (op == "apply_maps") return run_apply_maps(c);
  fail("unknown op " + op);
}
