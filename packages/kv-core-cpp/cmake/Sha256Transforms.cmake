# Adds the SHA-256 block transforms to a target. The portable transform is
# always built; the SIMD ones are added when the compiler can build them
# (a compile probe, not a CPU check: the running CPU is checked at runtime
# by src/sha256.cc, which also makes cross-compiling work).

include(CheckCXXSourceCompiles)

# Captured at include time: inside the function CMAKE_CURRENT_LIST_DIR would
# name the caller's directory.
set(_KVCORE_SHA256_ROOT "${CMAKE_CURRENT_LIST_DIR}/..")

function(kvcore_add_sha256_sources target)
  set(_src "${_KVCORE_SHA256_ROOT}/src")
  target_sources(${target} PRIVATE "${_src}/sha256_portable.cc")
  set(_compiled "portable")

  # CMAKE_REQUIRED_FLAGS is a space-separated string; function scope keeps
  # these settings from leaking to the caller.
  set(CMAKE_REQUIRED_FLAGS "-msha -msse4.1")
  check_cxx_source_compiles([=[
#include <immintrin.h>
int main() {
  __m128i a = _mm_setzero_si128();
  __m128i b = _mm_sha256rnds2_epu32(a, a, a);
  b = _mm_sha256msg2_epu32(_mm_sha256msg1_epu32(b, a), a);
  b = _mm_blend_epi16(b, a, 0xF0);
  return _mm_cvtsi128_si32(b);
}
]=] KVCORE_COMPILER_SUPPORTS_SHANI)

  set(CMAKE_REQUIRED_FLAGS "-march=armv8-a+crypto")
  check_cxx_source_compiles([=[
#include <arm_neon.h>
int main() {
  uint32x4_t a = vdupq_n_u32(1);
  uint32x4_t b = vsha256hq_u32(a, a, a);
  b = vsha256h2q_u32(b, a, a);
  b = vsha256su1q_u32(vsha256su0q_u32(b, a), a, a);
  return (int)vgetq_lane_u32(b, 0);
}
]=] KVCORE_COMPILER_SUPPORTS_ARMV8)
  unset(CMAKE_REQUIRED_FLAGS)

  if(KVCORE_COMPILER_SUPPORTS_SHANI)
    target_sources(${target} PRIVATE "${_src}/sha256_shani.cc")
    # Only this TU gets the ISA flags, so the rest of the library still runs
    # on CPUs without SHA-NI (dispatch checks CPUID before calling it).
    set_source_files_properties("${_src}/sha256_shani.cc" PROPERTIES COMPILE_OPTIONS "-msha;-msse4.1")
    target_compile_definitions(${target} PRIVATE KVCORE_HAVE_SHANI=1)
    list(APPEND _compiled "shani")
  endif()

  if(KVCORE_COMPILER_SUPPORTS_ARMV8)
    target_sources(${target} PRIVATE "${_src}/sha256_armv8.cc")
    set_source_files_properties("${_src}/sha256_armv8.cc" PROPERTIES COMPILE_OPTIONS "-march=armv8-a+crypto")
    target_compile_definitions(${target} PRIVATE KVCORE_HAVE_ARMV8=1)
    list(APPEND _compiled "armv8")
  endif()

  list(JOIN _compiled ", " _compiled_str)
  message(STATUS "kvcore SHA-256 transforms compiled: ${_compiled_str}")
endfunction()
