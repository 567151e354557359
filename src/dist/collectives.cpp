#include "tandem/dist/collectives.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::dist {

bool same_on_every_rank(const std::vector<int64_t>& values, ProcessGroup& group) {
  const auto wire = group.wire_device();  // NCCL takes CUDA tensors only
  auto most = torch::tensor({static_cast<int64_t>(values.size())}, torch::kInt64).to(wire);
  group.all_reduce(most, ReduceOp::kMax).wait();
  auto padded = torch::full({most.item<int64_t>() + 1}, -1, torch::kInt64);
  padded[0] = static_cast<int64_t>(values.size());
  if (!values.empty()) {
    padded.narrow(0, 1, static_cast<int64_t>(values.size())).copy_(torch::tensor(values, torch::kInt64));
  }
  auto low = padded.to(wire), high = low.clone();
  group.all_reduce(low, ReduceOp::kMin).wait();
  group.all_reduce(high, ReduceOp::kMax).wait();
  return low.equal(high);
}

void average_gradients(torch::nn::Module& module, ProcessGroup& group) {
  average_gradients(module.parameters(), group);
}

void average_gradients(const std::vector<torch::Tensor>& parameters, ProcessGroup& group) {
  std::vector<Work> pending;
  for (auto parameter : parameters) {
    auto grad = parameter.mutable_grad();
    if (!grad.defined()) continue;
    pending.push_back(group.all_reduce(grad, ReduceOp::kAvg));
  }
  for (auto& work : pending) work.wait();
}

void broadcast_coalesced(std::vector<torch::Tensor> tensors, ProcessGroup& group, int64_t root,
                         int64_t bucket_bytes) {
  // A group of one has nothing to send (DDP calls this every step, where
  // packing and unpacking would be a few dozen small kernels for nothing).
  if (group.size() == 1) return;
  CoalescedBroadcast(std::move(tensors), group, root, bucket_bytes).wait();
}

CoalescedBroadcast::CoalescedBroadcast(std::vector<torch::Tensor> tensors, ProcessGroup& group,
                                       int64_t root, int64_t bucket_bytes)
    : tensors_(std::move(tensors)), receiver_(group.rank() != root) {
  if (group.size() == 1) return;
  torch::NoGradGuard no_grad;
  // Packs, in order, per kind (dtype, device): kinds keep their own open pack.
  std::vector<int64_t> pack_bytes;
  std::map<std::pair<int, std::string>, size_t> open;  // kind -> index in members_
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    if (t.numel() == 0) continue;
    int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto kind = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    auto it = open.find(kind);
    if (it == open.end() || pack_bytes[it->second] + bytes > bucket_bytes) {
      members_.emplace_back();
      pack_bytes.push_back(0);
      it = open.insert_or_assign(kind, members_.size() - 1).first;
    }
    members_[it->second].push_back(i);
    pack_bytes[it->second] += bytes;
  }
  flat_.resize(members_.size());
  for (size_t p = 0; p < members_.size(); ++p) {
    std::vector<torch::Tensor> pieces;
    // A lone contiguous tensor is broadcast in place (a view of it). Not
    // reshape: a tensor of one uniform stride (every other column of a
    // matrix) reshapes to a strided 1-D view, whose elements the backend,
    // reading data_ptr and numel, would take as contiguous.
    for (size_t i : members_[p]) {
      const auto& t = tensors_[i];
      pieces.push_back(t.is_contiguous() ? t.view({-1}) : t.contiguous().view({-1}));
    }
    flat_[p] = pieces.size() == 1 ? pieces[0] : torch::cat(pieces);
    pending_.push_back(group.broadcast(flat_[p], root));
  }
}

void CoalescedBroadcast::wait() {
  torch::NoGradGuard no_grad;
  for (size_t p = 0; p < pending_.size(); ++p) {
    pending_[p].wait();
    if (!receiver_) continue;  // its tensors are what was sent
    int64_t offset = 0;
    for (size_t i : members_[p]) {
      auto& t = tensors_[i];
      auto piece = flat_[p].slice(0, offset, offset + t.numel()).view(t.sizes());
      offset += t.numel();
      if (piece.data_ptr() != t.data_ptr()) t.copy_(piece);
    }
  }
  pending_.clear();
}

void broadcast_module(torch::nn::Module& module, ProcessGroup& group, int64_t root) {
  std::vector<torch::Tensor> tensors = module.parameters();
  for (auto& buffer : module.buffers()) tensors.push_back(buffer);
  broadcast_coalesced(std::move(tensors), group, root);
}

void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int64_t root) {
  broadcast_coalesced(module.buffers(), group, root);
}

std::vector<std::string> all_gather_text(const std::string& text, ProcessGroup& group, const torch::Device& device) {
  const auto count = static_cast<size_t>(group.size());
  auto lengths_on = torch::TensorOptions().dtype(torch::kInt64).device(device);
  std::vector<torch::Tensor> lengths(count);
  for (auto& t : lengths) t = torch::empty({1}, lengths_on);
  group.all_gather(lengths, torch::full({1}, static_cast<int64_t>(text.size()), lengths_on)).wait();
  std::vector<int64_t> sizes(count);
  int64_t longest = 0;
  for (size_t r = 0; r < count; ++r) {
    sizes[r] = lengths[r].item<int64_t>();
    longest = std::max(longest, sizes[r]);
  }
  auto mine = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::memcpy(mine.data_ptr<uint8_t>(), text.data(), text.size());
  mine = mine.to(device);
  std::vector<torch::Tensor> all(count);
  for (auto& t : all) t = torch::empty_like(mine);
  group.all_gather(all, mine).wait();
  std::vector<std::string> texts(count);
  for (size_t r = 0; r < count; ++r) {
    auto bytes = all[r].cpu();
    texts[r].assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(sizes[r]));
  }
  return texts;
}

void check_same_parameters(torch::nn::Module& module, ProcessGroup& group, const std::string& who) {
  std::ostringstream text;
  for (const auto& p : module.named_parameters()) text << p.key() << p.value().sizes() << ";";
  // On the parameters' device: NCCL takes CUDA tensors only.
  torch::Device device = torch::kCPU;
  for (const auto& p : module.parameters()) {
    device = p.device();
    break;
  }
  auto options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto mine = torch::tensor({static_cast<int64_t>(std::hash<std::string>{}(text.str()) >> 1)}, options);
  std::vector<torch::Tensor> all(group.size());
  for (auto& t : all) t = torch::empty({1}, options);
  group.all_gather(all, mine).wait();
  for (int64_t r = 0; r < group.size(); ++r) {
    TANDEM_CHECK(torch::equal(all[r], all[0]), who, ": rank ", r,
                 " has different parameters (names or shapes) from rank 0; every rank must "
                 "build the same model");
  }
}

}  // namespace tandem::dist
