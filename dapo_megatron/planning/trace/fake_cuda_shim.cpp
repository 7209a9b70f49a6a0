// Fake CUDA device for the memory tracer (dapo_megatron/planning/trace): lets autograd run on
// FakeTensorMode tensors of device "cuda" in a CPU-only torch build.
//
// Without it the first backward aborts the process (an uncatchable C++ terminate): autograd's
// InputMetadata asks c10::impl::getDeviceGuardImpl(CUDA), which a CPU build does not register,
// and GraphTask::stash_current_streams calls at::getAccelerator(true), which asks the CUDA
// hooks whether CUDA exists. This library registers c10's own test guard (FakeGuardImpl, eight
// devices, streams and events that do nothing) and CUDA hooks that say "CUDA is there".
//
// It must be LD_PRELOADed: at::detail::getCUDAHooks() caches the hooks it finds the first
// time it is asked, which importing torch already does. Built by scripts/setup.sh against
// the installed torch's headers (pinned: these are torch internals).
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {

struct FakeCudaHooks final : at::CUDAHooksInterface {
  explicit FakeCudaHooks(at::CUDAHooksArgs) {}
  void init() const override {}
  bool hasCUDA() const override { return true; }
  bool isAvailable() const override { return true; }
  bool isBuilt() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  int getNumGPUs() const override { return 1; }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
namespace at {
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", FakeCudaHooks);
}  // namespace at

extern "C" int dapo_fake_cuda_shim_loaded() { return 1; }
