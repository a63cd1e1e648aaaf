// ddtree-deploy GPU check: our own stand-in for apache-tvm-ffi's tvm/ffi/dtype.h. SGLang's
// tensor.h compares and prints DLDataType values; like tvm-ffi, the operators live in the
// root namespace so argument-dependent lookup finds them from namespace sglang::host.
#pragma once

#include <dlpack/dlpack.h>

#include <ostream>

inline std::ostream& operator<<(std::ostream& os, DLDataType dtype) {
  const char* name = "unknown";
  switch (dtype.code) {
    case kDLInt: name = "int"; break;
    case kDLUInt: name = "uint"; break;
    case kDLFloat: name = "float"; break;
    case kDLBfloat: name = "bfloat"; break;
    case kDLBool: name = "bool"; break;
    default: break;
  }
  os << name;
  if (dtype.code != kDLBool) os << static_cast<int>(dtype.bits);
  if (dtype.lanes != 1) os << "x" << dtype.lanes;
  return os;
}

inline bool operator==(const DLDataType& lhs, const DLDataType& rhs) {
  return lhs.code == rhs.code && lhs.bits == rhs.bits && lhs.lanes == rhs.lanes;
}

inline bool operator!=(const DLDataType& lhs, const DLDataType& rhs) {
  return !(lhs == rhs);
}
