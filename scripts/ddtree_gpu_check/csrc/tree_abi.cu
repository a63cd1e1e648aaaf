// ddtree-deploy GPU check: our thin host wrapper around SGLang's own tree kernels.
//
// SGLang 0.5.20+ builds speculative/tree.cuh at run time through apache-tvm-ffi (load_jit),
// which the lent GPU machine lacks. This file includes SGLang's tree.cuh unchanged, read
// from the release wheel (the carried folder, never committed here), and exposes its two
// host functions, build_tree_kernel_efficient and verify_tree_greedy, through a plain C ABI
// that Python calls with ctypes. The tvm-ffi pieces tree.cuh's closure names come from our
// own headers in shim/ (TensorView, DLDataType operators, TVMFFIEnvGetStream, DLPack).
//
// Every SGLang host check (TensorMatcher shapes, strides, dtypes, devices, the CHECK_HOSTs)
// runs as in SGLang; a failed one throws PanicError, which is turned into return code 1 and
// its message, never an abort.
#include <speculative/tree.cuh>

#include <cstdint>
#include <cstring>
#include <exception>

// One tensor as Python describes it (tree_abi.py's _Tensor mirrors this layout). Outside the
// anonymous namespace: an extern "C" function taking a type with internal linkage would get
// internal linkage itself (not exported).
struct TensorArg {
  void* data;
  int32_t ndim;
  int32_t device_type;  // DLDeviceType
  int32_t device_id;
  uint8_t dtype_code;  // DLDataTypeCode
  uint8_t dtype_bits;
  uint16_t reserved;
  int64_t shape[4];
  int64_t strides[4];
};

namespace {

thread_local void* g_stream = nullptr;

struct DLBox {
  DLTensor t;
  explicit DLBox(const TensorArg& a) {
    t.data = a.data;
    t.device = DLDevice{static_cast<DLDeviceType>(a.device_type), a.device_id};
    t.ndim = a.ndim;
    t.dtype = DLDataType{a.dtype_code, a.dtype_bits, 1};
    t.shape = const_cast<int64_t*>(a.shape);
    t.strides = const_cast<int64_t*>(a.strides);
    t.byte_offset = 0;
  }
};

void copy_message(const char* what, char* err, int64_t err_len) {
  if (err == nullptr || err_len <= 0) return;
  std::strncpy(err, what, static_cast<size_t>(err_len - 1));
  err[err_len - 1] = '\0';
}

template <typename F>
int guarded(void* stream, char* err, int64_t err_len, F&& call) {
  g_stream = stream;
  try {
    call();
  } catch (const sglang::host::PanicError& e) {
    copy_message(e.what(), err, err_len);
    return 1;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
    return 2;
  }
  return 0;
}

}  // namespace

extern "C" void* TVMFFIEnvGetStream(int32_t /*device_type*/, int32_t /*device_id*/) {
  return g_stream;
}

extern "C" int ddtree_tree_abi_version() {
  return 1;
}

// t: parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
// retrive_next_token, retrive_next_sibling (SGLang's argument order).
extern "C" int ddtree_build_tree_kernel_efficient(
    const TensorArg* t,
    int64_t topk,
    int64_t depth,
    int64_t draft_token_num,
    int64_t tree_mask_mode,
    void* stream,
    char* err,
    int64_t err_len) {
  return guarded(stream, err, err_len, [&] {
    DLBox a0(t[0]), a1(t[1]), a2(t[2]), a3(t[3]), a4(t[4]), a5(t[5]), a6(t[6]), a7(t[7]);
    sglang::build_tree_kernel_efficient(
        &a0.t, &a1.t, &a2.t, &a3.t, &a4.t, &a5.t, &a6.t, &a7.t, topk, depth, draft_token_num, tree_mask_mode);
  });
}

// t: predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
// retrive_next_sibling, target_predict (SGLang's argument order).
extern "C" int ddtree_verify_tree_greedy(const TensorArg* t, void* stream, char* err, int64_t err_len) {
  return guarded(stream, err, err_len, [&] {
    DLBox a0(t[0]), a1(t[1]), a2(t[2]), a3(t[3]), a4(t[4]), a5(t[5]), a6(t[6]), a7(t[7]);
    sglang::verify_tree_greedy(&a0.t, &a1.t, &a2.t, &a3.t, &a4.t, &a5.t, &a6.t, &a7.t);
  });
}
