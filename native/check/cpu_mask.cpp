// libcpu_mask.so: a process that preloads it sees a smaller x86-64 CPU than the one it runs on,
// in every library it loads (ours, XNNPACK's cpuinfo, libgcc's __builtin_cpu_supports): the
// measurements and tests of an AVX2 host's or a baseline host's paths on a bigger host.
//
//   ETSERVE_CPU_MASK=avx2 LD_PRELOAD=native/build/libcpu_mask.so python ...
//
// ETSERVE_CPU_MASK: avx2 (x86-64-v3: no AVX-512, AVX-VNNI, AMX nor AVX10) or x86-64 (the
// baseline: SSE2, no SSSE3 and on). Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, the CPU
// flag cpuid_fault) makes every cpuid instruction of the process trap; the handler runs the
// real one with faulting off for that instant, clears the masked bits and steps over it. The
// setting is inherited by threads and forks and cleared by exec (the preload sets it again).
// Where the kernel or the CPU cannot fault cpuid the process exits at load (status 3): a
// measurement that believes it ran masked must not run unmasked.
//
// Not masked: what glibc chose at start-up (its string functions, before any constructor
// runs; GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,... covers those) and xgetbv (the OS still
// saves the AVX-512 state; code that checks cpuid first, as all of ours does, never asks).
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

enum class Mask { kNone, kAvx2, kBaseline };
Mask g_mask = Mask::kNone;

constexpr uint32_t bit(int n) { return uint32_t(1) << n; }

long set_cpuid(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }

// The masked result of leaf `leaf`, subleaf `sub` (r: eax, ebx, ecx, edx).
void masked(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
  if (leaf == 7 && sub == 0) {
    // ebx: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ecx: VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ;
    // edx: 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8
    r[1] &= ~(bit(16) | bit(17) | bit(21) | bit(26) | bit(27) | bit(28) | bit(30) | bit(31));
    r[2] &= ~(bit(1) | bit(6) | bit(11) | bit(12) | bit(14));
    r[3] &= ~(bit(2) | bit(3) | bit(8) | bit(22) | bit(23) | bit(24) | bit(25));
  }
  if (leaf == 7 && sub == 1) {
    // eax: AVX-VNNI, AVX512-BF16, AMX-FP16, AVX-IFMA; edx: AVX-VNNI-INT8, AVX-NE-CONVERT,
    // AVX-VNNI-INT16, AMX-COMPLEX, AVX10
    r[0] &= ~(bit(4) | bit(5) | bit(21) | bit(23));
    r[3] &= ~(bit(4) | bit(5) | bit(8) | bit(10) | bit(19));
  }
  if (leaf == 0x1e || leaf == 0x24) r[0] = r[1] = r[2] = r[3] = 0;  // AMX tiles, AVX10
  if (g_mask != Mask::kBaseline) return;
  if (leaf == 1) {
    // ecx: SSE3, PCLMULQDQ, SSSE3, FMA, CX16, SSE4.1, SSE4.2, MOVBE, POPCNT, AES, XSAVE, OSXSAVE,
    // AVX, F16C
    r[2] &= ~(bit(0) | bit(1) | bit(9) | bit(12) | bit(13) | bit(19) | bit(20) | bit(22) | bit(23) | bit(25) |
              bit(26) | bit(27) | bit(28) | bit(29));
  }
  if (leaf == 7 && sub == 0) {
    r[1] &= ~(bit(3) | bit(5) | bit(8));  // BMI1, AVX2, BMI2
    r[2] &= ~(bit(8) | bit(9) | bit(10));  // GFNI, VAES, VPCLMULQDQ
  }
  if (leaf == 0x80000001u) r[2] &= ~(bit(5) | bit(6));  // LZCNT, SSE4A
}

void on_segv(int sig, siginfo_t* info, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  greg_t* g = uc->uc_mcontext.gregs;
  const auto* ip = reinterpret_cast<const unsigned char*>(g[REG_RIP]);
  if (info->si_code != SI_KERNEL || ip[0] != 0x0F || ip[1] != 0xA2) {  // not cpuid: a real fault
    signal(sig, SIG_DFL);
    return;  // the instruction runs again and faults with the default action
  }
  uint32_t r[4];
  set_cpuid(1);
  masked(static_cast<uint32_t>(g[REG_RAX]), static_cast<uint32_t>(g[REG_RCX]), r);
  set_cpuid(0);
  g[REG_RAX] = r[0];
  g[REG_RBX] = r[1];
  g[REG_RCX] = r[2];
  g[REG_RDX] = r[3];
  g[REG_RIP] += 2;
}

__attribute__((constructor)) void install() {
  const char* m = getenv("ETSERVE_CPU_MASK");
  if (m == nullptr || *m == '\0') return;
  if (strcmp(m, "avx2") == 0) {
    g_mask = Mask::kAvx2;
  } else if (strcmp(m, "x86-64") == 0) {
    g_mask = Mask::kBaseline;
  } else {
    fprintf(stderr, "libcpu_mask: ETSERVE_CPU_MASK=%s: expected avx2 or x86-64\n", m);
    _exit(3);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, nullptr) != 0 || set_cpuid(0) != 0) {
    fprintf(stderr, "libcpu_mask: this CPU or kernel cannot fault cpuid (no cpuid_fault): not run masked\n");
    _exit(3);
  }
}

}  // namespace
