// ddtree-deploy GPU check: our own stand-in for apache-tvm-ffi's c_env_api.h. SGLang's
// LaunchKernel asks it for the device's current stream; our host wrapper (tree_abi.cu)
// defines it and answers with the stream the Python caller passed (torch's current stream).
#pragma once

#include <cstdint>

extern "C" void* TVMFFIEnvGetStream(int32_t device_type, int32_t device_id);
