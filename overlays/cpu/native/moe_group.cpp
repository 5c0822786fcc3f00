// imageforge_moe_group: the sorted-expert MoE's grouping step as one C++ kernel (a counting sort).
//
// group_by_expert(topk_ids [T, K] integer, num_experts E) -> (order [T*K] int64, offsets [E + 1] int64):
// `order` lists the flattened (token, slot) pairs sorted by expert id, stable (pairs of one expert keep
// their flat order: what torch.argsort(flat, stable=True) gives), and expert e's pairs are
// order[offsets[e]:offsets[e + 1]]. An id outside [0, E) is an error, never dropped silently.
// The headers it uses, not <torch/extension.h> (all of libtorch's C++ API: ~33 s of g++ here against ~13 s).
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

namespace {

template <typename T>
void count_and_place(const T* ids, int64_t n, int64_t num_experts, int64_t* order, int64_t* offsets) {
  std::vector<int64_t> counts(num_experts + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = static_cast<int64_t>(ids[i]);
    TORCH_CHECK(e >= 0 && e < num_experts, "group_by_expert: expert id ", e, " at pair ", i,
                " is outside [0, ", num_experts, ")");
    ++counts[e + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) counts[e + 1] += counts[e];
  for (int64_t e = 0; e <= num_experts; ++e) offsets[e] = counts[e];
  for (int64_t i = 0; i < n; ++i) order[counts[static_cast<int64_t>(ids[i])]++] = i;
}

}  // namespace

std::vector<at::Tensor> group_by_expert(const at::Tensor& topk_ids, int64_t num_experts) {
  TORCH_CHECK(topk_ids.device().is_cpu(), "group_by_expert: topk_ids must be on the CPU");
  TORCH_CHECK(num_experts > 0, "group_by_expert: num_experts must be positive");
  const at::Tensor flat = topk_ids.reshape({-1}).contiguous();
  const int64_t n = flat.numel();
  auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor order = at::empty({n}, opts);
  at::Tensor offsets = at::empty({num_experts + 1}, opts);
  AT_DISPATCH_INTEGRAL_TYPES(flat.scalar_type(), "group_by_expert", [&] {
    count_and_place<scalar_t>(flat.data_ptr<scalar_t>(), n, num_experts, order.data_ptr<int64_t>(),
                              offsets.data_ptr<int64_t>());
  });
  return {order, offsets};
}

PYBIND11_MODULE(imageforge_moe_group, m) {
  m.def("group_by_expert", &group_by_expert, "Stable counting sort of topk ids by expert: (order, offsets)",
        pybind11::arg("topk_ids"), pybind11::arg("num_experts"));
}
