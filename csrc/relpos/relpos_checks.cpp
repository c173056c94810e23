#include "relpos_checks.h"

#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

#include "../core/grid_index.h"
#include "../aten/shape_str.h"

namespace posattn {
namespace {

bool is_half(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

// A floating tensor of q's dtype and device. `float32_with_half`: float32 is
// accepted too when q is float16 / bfloat16 (sigma, whose gradient overflows
// float16).
void check_float_tensor(const at::Tensor& t, const char* name, const at::Tensor& q,
                        bool float32_with_half = false) {
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "relpos_attention: ", name,
                   " must be a floating-point tensor, got ", t.scalar_type());
  const bool ok = t.scalar_type() == q.scalar_type() ||
                  (float32_with_half && is_half(q.scalar_type()) && t.scalar_type() == at::kFloat);
  TORCH_CHECK_TYPE(ok, "relpos_attention: ", name, " has dtype ", t.scalar_type(), " but q has dtype ",
                   q.scalar_type(),
                   float32_with_half ? "; it must have q's dtype (or float32 when q is float16 or bfloat16)"
                                     : "; all tensor arguments must share one dtype");
  TORCH_CHECK_VALUE(t.device() == q.device(), "relpos_attention: ", name, " is on ", t.device(),
                    " but q is on ", q.device(), "; all tensors must be on one device");
}

// lse and its gradient: the accumulation type of q's dtype, on q's device.
void check_lse_tensor(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK_TYPE(t.scalar_type() == lse_dtype(q.scalar_type()), "relpos_attention_backward: ", name,
                   " has dtype ", t.scalar_type(), " but must have ", lse_dtype(q.scalar_type()),
                   " (the dtype of the forward's lse for q of dtype ", q.scalar_type(), ")");
  TORCH_CHECK_VALUE(t.device() == q.device(), "relpos_attention: ", name, " is on ", t.device(),
                    " but q is on ", q.device(), "; all tensors must be on one device");
}

// The largest finite value of a floating dtype.
double dtype_max_value(at::ScalarType dtype) {
  double value = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "dtype_max_value",
                                  [&] { value = static_cast<double>(std::numeric_limits<scalar_t>::max()); });
  return value;
}

}  // namespace

SpanMode parse_span_mode(const std::string& span_mode) {
  if (span_mode == "add") return SpanMode::kAdd;
  if (span_mode == "multiply") return SpanMode::kMultiply;
  TORCH_CHECK_VALUE(false, "relpos_attention: span_mode must be \"add\" or \"multiply\", got \"", span_mode,
                    "\"");
}

RelposShape check_relpos_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
                                at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma,
                                double threshold, const std::string& span_mode, double scale,
                                const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
                                const std::string& window_border, at::OptionalIntArrayRef window_right,
                                at::OptionalIntArrayRef window_stride, at::OptionalIntArrayRef window_causal,
                                const c10::optional<at::Tensor>& packed_offsets,
                                const c10::optional<at::Tensor>& packed_shapes) {
  RelposShape s;
  TORCH_CHECK_TYPE(at::isFloatingType(q.scalar_type()),
                   "relpos_attention: q must be a floating-point tensor, got ", q.scalar_type());
  TORCH_CHECK_VALUE(q.dim() == 4, "relpos_attention: q must have shape (B, H, N, D), got ",
                    shape_str(q.sizes()));
  s.B = q.size(0);
  s.H = q.size(1);
  s.N = q.size(2);
  s.D = q.size(3);
  TORCH_CHECK_VALUE(s.N >= 1, "relpos_attention: q must hold at least one token (N >= 1)");
  TORCH_CHECK_VALUE(s.D >= 1, "relpos_attention: q must have head dim D >= 1");
  check_float_tensor(k, "k", q);
  check_float_tensor(v, "v", q);
  TORCH_CHECK_VALUE(k.sizes() == q.sizes(), "relpos_attention: k must have the shape of q ",
                    shape_str(q.sizes()), ", got ", shape_str(k.sizes()));
  TORCH_CHECK_VALUE(v.dim() == 4 && v.size(0) == s.B && v.size(1) == s.H && v.size(2) == s.N,
                    "relpos_attention: v must have shape (B, H, N, Dv) = (", s.B, ", ", s.H, ", ", s.N,
                    ", Dv), got ", shape_str(v.sizes()));
  s.Dv = v.size(3);
  TORCH_CHECK_VALUE(s.Dv >= 1, "relpos_attention: v must have value dim Dv >= 1");

  // Grid.
  TORCH_CHECK_VALUE(!grid.empty(), "relpos_attention: grid must list at least one axis");
  TORCH_CHECK_VALUE(static_cast<int64_t>(grid.size()) <= kMaxGridDims,
                    "relpos_attention: grid may have at most ", kMaxGridDims, " axes, got ", grid.size());
  // Products are overflow-checked: a product that wrapped around could pass
  // prod == N and send the kernels out of bounds.
  int64_t prod = 1, U = 1;
  bool overflow = false;
  for (size_t d = 0; d < grid.size(); ++d) {
    TORCH_CHECK_VALUE(grid[d] >= 1, "relpos_attention: grid axis ", d, " must be >= 1, got ", grid[d]);
    overflow |= __builtin_mul_overflow(prod, grid[d], &prod);
    int64_t width = 0;  // 2 n_d - 1
    overflow |= __builtin_mul_overflow(grid[d], int64_t{2}, &width);
    overflow |= __builtin_mul_overflow(U, width - 1, &U);
  }
  TORCH_CHECK_VALUE(!overflow, "relpos_attention: grid ", shape_str(grid),
                    " is too large: prod(grid) or the number of offsets prod(2 n_d - 1) "
                    "overflows int64");
  s.grid = grid.vec();
  TORCH_CHECK_VALUE(
      packed_offsets.has_value() == packed_shapes.has_value(),
      "relpos_attention: packed_offsets and packed_shapes must be given together (got packed_offsets ",
      packed_offsets.has_value() ? "set" : "None", ", packed_shapes ",
      packed_shapes.has_value() ? "set" : "None", ")");
  if (packed_offsets.has_value()) {
    // A packed call: `grid` is max_grid; the samples' tokens and grids are checked by value
    // (check_packed_values_cpu, or the CUDA kernels' device-side check).
    const at::Tensor &off = *packed_offsets, &shp = *packed_shapes;
    for (const auto& [t, name] : {std::pair{&off, "packed_offsets"}, std::pair{&shp, "packed_shapes"}}) {
      TORCH_CHECK_TYPE(t->scalar_type() == at::kInt, "relpos_attention: ", name, " must be int32, got ",
                       t->scalar_type());
      TORCH_CHECK_VALUE(t->device() == q.device(), "relpos_attention: ", name, " is on ", t->device(),
                        " but q is on ", q.device(), "; all tensors must be on one device");
    }
    TORCH_CHECK_VALUE(shp.dim() == 2 && shp.size(0) >= 1 && shp.size(1) == static_cast<int64_t>(grid.size()),
                      "relpos_attention: packed_shapes must have shape (S, G) with S >= 1 samples and G = ",
                      grid.size(), " axes (as max_grid ", shape_str(grid), "), got ", shape_str(shp.sizes()));
    s.packed_samples = shp.size(0);
    TORCH_CHECK_VALUE(off.dim() == 1 && off.size(0) == s.packed_samples + 1,
                      "relpos_attention: packed_offsets must have shape (S + 1,) = (", s.packed_samples + 1,
                      ",), got ", shape_str(off.sizes()));
    TORCH_CHECK_VALUE(s.B == 1,
                      "relpos_attention: a packed call takes q of shape (1, H, T, D) (the samples are "
                      "the batch), got B = ",
                      s.B);
  } else {
    TORCH_CHECK_VALUE(prod == s.N, "relpos_attention: prod(grid) = ", prod,
                      " must equal the number of tokens N = ", s.N, " (grid ", shape_str(grid), ")");
  }

  // Learned bias per head and offset.
  if (bias.has_value()) {
    s.has_bias = true;
    check_float_tensor(*bias, "bias", q);
    TORCH_CHECK_VALUE(bias->dim() == 2 && bias->size(0) == s.H && bias->size(1) == U,
                      "relpos_attention: bias must have shape (H, U) = (", s.H, ", ", U,
                      ") with U = prod(2 n_d - 1) for grid ", shape_str(grid), ", got ",
                      shape_str(bias->sizes()));
  }

  // Fixed window: cells before / after the centre, stride, causal axes.
  auto per_axis = [&](const at::OptionalIntArrayRef& a, const char* name, const char* what = "value") {
    TORCH_CHECK_VALUE(a->size() == grid.size(), "relpos_attention: ", name, " must give one ", what,
                      " per grid axis (", grid.size(), " for grid ", shape_str(grid), "), got ", a->size(),
                      ": ", shape_str(*a));
  };
  for (const auto& [arg, name] :
       {std::pair{window_right, "window_right"}, std::pair{window_stride, "window_stride"},
        std::pair{window_causal, "window_causal"}})
    TORCH_CHECK_VALUE(!arg.has_value() || window.has_value(), "relpos_attention: ", name,
                      " needs a window (window = None)");
  if (window.has_value()) {
    per_axis(window, "window", "half width");
    for (size_t d = 0; d < window->size(); ++d)
      TORCH_CHECK_VALUE((*window)[d] >= 0, "relpos_attention: window half widths must be >= 0, got ",
                        shape_str(*window), " (axis ", d, ")");
    s.set_symmetric_window(window->vec());
    if (window_right.has_value()) {
      per_axis(window_right, "window_right");
      // NATTEN's split of a kernel of k cells: k / 2 before the centre, k - 1 - k / 2 after. Other
      // splits would let a strided query group's window miss its own queries (AxisLimit's invariants).
      for (size_t d = 0; d < grid.size(); ++d)
        TORCH_CHECK_VALUE(
            (*window_right)[d] >= 0 &&
                ((*window_right)[d] == (*window)[d] || (*window_right)[d] == (*window)[d] - 1),
            "relpos_attention: window_right must be >= 0 and equal window or window - 1 on every axis (a "
            "kernel of window + window_right + 1 cells, split as NATTEN does), got window ",
            shape_str(*window), ", window_right ", shape_str(*window_right), " (axis ", d, ")");
      s.window_right = window_right->vec();
    }
    if (window_stride.has_value()) {
      per_axis(window_stride, "window_stride");
      for (size_t d = 0; d < grid.size(); ++d) {
        const int64_t k = s.window_left[d] + s.window_right[d] + 1;
        TORCH_CHECK_VALUE((*window_stride)[d] >= 1 && (*window_stride)[d] <= k,
                          "relpos_attention: window_stride must be in [1, kernel size] on every axis (kernel "
                          "size = window + window_right + 1 = ",
                          k, " on axis ", d, "), got ", shape_str(*window_stride));
      }
      s.window_stride = window_stride->vec();
    }
    if (window_causal.has_value()) {
      per_axis(window_causal, "window_causal");
      for (size_t d = 0; d < grid.size(); ++d)
        TORCH_CHECK_VALUE((*window_causal)[d] == 0 || (*window_causal)[d] == 1,
                          "relpos_attention: window_causal must be 0 or 1 per grid axis, got ",
                          shape_str(*window_causal));
      s.window_causal = window_causal->vec();
    }
  }
  TORCH_CHECK_VALUE(window_border == "clip" || window_border == "shift",
                    "relpos_attention: window_border must be \"clip\" or \"shift\", got \"", window_border,
                    "\"");
  s.window_shift = window_border == "shift";

  // Positional query and table.
  TORCH_CHECK_VALUE(q_pos.has_value() == rel.has_value(),
                    "relpos_attention: q_pos and rel must be given together (got q_pos ",
                    q_pos.has_value() ? "set" : "None", ", rel ", rel.has_value() ? "set" : "None", ")");
  if (q_pos.has_value()) {
    s.has_pos = true;
    check_float_tensor(*q_pos, "q_pos", q);
    check_float_tensor(*rel, "rel", q);
    TORCH_CHECK_VALUE(q_pos->sizes() == q.sizes(), "relpos_attention: q_pos must have the shape of q ",
                      shape_str(q.sizes()), ", got ", shape_str(q_pos->sizes()));
    TORCH_CHECK_VALUE(rel->dim() == 3 && rel->size(0) == s.H && rel->size(1) == U && rel->size(2) == s.D,
                      "relpos_attention: rel must have shape (H, U, D) = (", s.H, ", ", U, ", ", s.D,
                      ") with U = prod(2 n_d - 1) for grid ", shape_str(grid), ", got ",
                      shape_str(rel->sizes()));
  }

  // Span.
  s.mode = parse_span_mode(span_mode);
  if (sigma.has_value()) {
    s.has_sigma = true;
    check_float_tensor(*sigma, "sigma", q, /*float32_with_half=*/true);
    TORCH_CHECK_VALUE(
        sigma->dim() == 2 && sigma->size(0) == s.H && sigma->size(1) == static_cast<int64_t>(grid.size()),
        "relpos_attention: sigma must have shape (H, G) = (", s.H, ", ", grid.size(), "), got ",
        shape_str(sigma->sizes()));
  }
  TORCH_CHECK_VALUE(std::isfinite(threshold) && threshold >= 0.0 && threshold < 1.0,
                    "relpos_attention: threshold must be in [0, 1), got ", threshold);
  TORCH_CHECK_VALUE(threshold == 0.0 || s.has_sigma,
                    "relpos_attention: threshold > 0 requires sigma (the span widths)");
  TORCH_CHECK_VALUE(std::isfinite(scale), "relpos_attention: scale must be finite, got ", scale);
  const double dtype_max = dtype_max_value(q.scalar_type());
  TORCH_CHECK_VALUE(std::abs(scale) <= dtype_max, "relpos_attention: scale = ", scale,
                    " overflows the tensors' dtype ", q.scalar_type(), " (largest finite value ", dtype_max,
                    ")");
  return s;
}

void check_sigma_values_cpu(const at::Tensor& sigma) {
  const at::Tensor s = sigma.to(at::kDouble);
  const bool ok = (s > 0).logical_and(s.isfinite()).all().item<bool>();
  TORCH_CHECK_VALUE(ok, "relpos_attention: sigma must be positive and finite everywhere, got ", "min ",
                    s.min().item<double>(), " and max ", s.max().item<double>());
}

void check_packed_values_cpu(const RelposShape& s, const at::Tensor& offsets, const at::Tensor& shapes) {
  const at::Tensor off = offsets.contiguous(), shp = shapes.contiguous();
  const int32_t* o = off.data_ptr<int32_t>();
  const int32_t* n = shp.data_ptr<int32_t>();
  const int64_t S = s.packed_samples, G = static_cast<int64_t>(s.grid.size());
  TORCH_CHECK_VALUE(o[0] == 0,
                    "relpos_attention: packed_offsets must start at 0, got packed_offsets[0] = ", o[0]);
  for (int64_t i = 0; i < S; ++i) {
    TORCH_CHECK_VALUE(o[i + 1] > o[i], "relpos_attention: packed_offsets must increase, got packed_offsets[",
                      i, "] = ", o[i], " and packed_offsets[", i + 1, "] = ", o[i + 1]);
    int64_t tokens = 1;
    for (int64_t d = 0; d < G; ++d) {
      const int64_t e = n[i * G + d];
      TORCH_CHECK_VALUE(e >= 1 && e <= s.grid[d], "relpos_attention: packed_shapes[", i,
                        "] = ", shape_str(at::IntArrayRef(std::vector<int64_t>(n + i * G, n + (i + 1) * G))),
                        " must have extents in [1, max_grid] on every axis (max_grid ", shape_str(s.grid),
                        ", axis ", d, ")");
      tokens *= e;
    }
    TORCH_CHECK_VALUE(tokens == static_cast<int64_t>(o[i + 1]) - o[i], "relpos_attention: packed_shapes[", i,
                      "] has ", tokens, " tokens but packed_offsets give it packed_offsets[", i + 1,
                      "] - packed_offsets[", i, "] = ", static_cast<int64_t>(o[i + 1]) - o[i]);
  }
  TORCH_CHECK_VALUE(o[S] <= s.N, "relpos_attention: the packed samples hold packed_offsets[-1] = ", o[S],
                    " tokens but q has only T = ", s.N);
}

void check_relpos_backward_inputs(const RelposShape& s, const at::Tensor& q, const at::Tensor& grad_out,
                                  const c10::optional<at::Tensor>& grad_lse, const at::Tensor& out,
                                  const at::Tensor& lse) {
  const std::vector<int64_t> out_shape{s.B, s.H, s.N, s.Dv};
  const std::vector<int64_t> lse_shape{s.B, s.H, s.N};
  check_float_tensor(grad_out, "grad_out", q);
  check_float_tensor(out, "out", q);
  check_lse_tensor(lse, "lse", q);
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef(out_shape),
                    "relpos_attention_backward: grad_out must have shape ", shape_str(out_shape), ", got ",
                    shape_str(grad_out.sizes()));
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(out_shape),
                    "relpos_attention_backward: out must have shape ", shape_str(out_shape), ", got ",
                    shape_str(out.sizes()));
  TORCH_CHECK_VALUE(lse.sizes() == at::IntArrayRef(lse_shape),
                    "relpos_attention_backward: lse must have shape ", shape_str(lse_shape), ", got ",
                    shape_str(lse.sizes()));
  if (grad_lse.has_value()) {
    check_lse_tensor(*grad_lse, "grad_lse", q);
    TORCH_CHECK_VALUE(grad_lse->sizes() == at::IntArrayRef(lse_shape),
                      "relpos_attention_backward: grad_lse must have shape ", shape_str(lse_shape), ", got ",
                      shape_str(grad_lse->sizes()));
  }
}

}  // namespace posattn
