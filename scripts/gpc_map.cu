// Which SMs share a GPC, measured with thread-block clusters (a cluster's CTAs always run in one GPC).
//
// Issue 11: on the host link, the drain's share of a program depends on which SMs the grid occupies (data/h200x1
// train_programs_p: at P = 16 the eight programs on SMs 124-131 take ~2x the median's time and four others 1/12;
// at P = 32-66, SMs 16 and 32 are as slow as SMs 124-131). Hypothesis: the drain is shared per GPC first. This
// program gives the SM -> GPC map of the chip it runs on, to test that against the per-program records.
//
// Each CTA asks for most of an SM's shared memory, so one CTA runs per SM; every CTA records %smid, %clusterid.x
// and %cluster_ctarank, then waits a bounded HOLD_NS (globaltimer) so that every cluster of a launch is resident
// at once. For cluster sizes 1 (the plain dispatch order), 2, 4, 8 and 16 (non-portable), REPEATS launches each
// of as many clusters as cudaOccupancyMaxActiveClusters says fit. Output: JSON lines on stdout, one per launch
// ({"cluster_size", "launch", "max_active_clusters", "blocks": [[block, cluster, rank, smid], ...]}), and first
// one line of device properties. Build: nvcc -O2 -arch=sm_90 -o gpc_map scripts/gpc_map.cu (a program), or with
// -shared -Xcompiler -fPIC -DGPC_MAP_LIB (a library: gpc_map_run).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "gpc_map: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); return 2; } } while (0)

static const unsigned long long HOLD_NS = 200000ull;   // 200 us: every cluster of a launch resident together
static const int REPEATS = 12;

__global__ void where(int* sm, int* cl, int* rk, unsigned long long hold_ns) {
  if (threadIdx.x == 0) {
    unsigned s, c, r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(c));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    sm[blockIdx.x] = (int)s;               // (the dynamic shared memory is reserved at launch, used or not)
    cl[blockIdx.x] = (int)c;
    rk[blockIdx.x] = (int)r;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < hold_ns);   // bounded
  }
}

// The map into ``path`` (NULL: stdout). Also a shared library (nvcc -shared -Xcompiler -fPIC -DGPC_MAP_LIB):
// scripts/trains_gpc.py calls it through ctypes inside the process that records the trains, so both see one
// %smid numbering. Returns 0, or 2 after a CUDA error (named on stderr).
extern "C" int gpc_map_run(const char* path) {
  FILE* out = path ? fopen(path, "w") : stdout;
  if (!out) { fprintf(stderr, "gpc_map: cannot open %s\n", path); return 2; }
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  const int S = p.multiProcessorCount;
  const size_t smem = p.sharedMemPerMultiprocessor / 2 + 1024;   // more than half an SM's: one CTA per SM
  fprintf(out, "{\"device\": \"%s\", \"sm_count\": %d, \"cc\": \"%d.%d\", \"uuid\": \"", p.name, S, p.major, p.minor);
  for (int i = 0; i < 16; ++i) {
    fprintf(out, "%02x", (unsigned char)p.uuid.bytes[i]);
    if (i == 3 || i == 5 || i == 7 || i == 9) fprintf(out, "-");
  }
  fprintf(out, "\", \"smem_per_cta\": %zu, \"hold_ns\": %llu}\n", smem, HOLD_NS);
  CHECK(cudaFuncSetAttribute(where, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  CHECK(cudaFuncSetAttribute(where, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int *sm, *cl, *rk;
  const int cap = 4 * S;
  CHECK(cudaMalloc(&sm, cap * sizeof(int)));
  CHECK(cudaMalloc(&cl, cap * sizeof(int)));
  CHECK(cudaMalloc(&rk, cap * sizeof(int)));
  std::vector<int> hs(cap), hc(cap), hr(cap);
  const int sizes[] = {1, 2, 4, 8, 16};
  for (int cs : sizes) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(32, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(cs, 1, 1);
    int nclusters = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&nclusters, where, &cfg);
    if (e != cudaSuccess || nclusters < 1) {
      fprintf(out, "{\"cluster_size\": %d, \"error\": \"%s\", \"max_active_clusters\": %d}\n", cs,
             e != cudaSuccess ? cudaGetErrorString(e) : "no cluster fits", nclusters);
      cudaGetLastError();
      continue;
    }
    const int blocks = nclusters * cs > cap ? (cap / cs) * cs : nclusters * cs;
    cfg.gridDim = dim3(blocks, 1, 1);
    for (int rep = 0; rep < REPEATS; ++rep) {
      CHECK(cudaMemset(sm, 0xff, cap * sizeof(int)));
      e = cudaLaunchKernelEx(&cfg, where, sm, cl, rk, HOLD_NS);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
      if (e != cudaSuccess) {
        fprintf(out, "{\"cluster_size\": %d, \"launch\": %d, \"error\": \"%s\"}\n", cs, rep, cudaGetErrorString(e));
        cudaGetLastError();
        break;
      }
      CHECK(cudaMemcpy(hs.data(), sm, blocks * sizeof(int), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hc.data(), cl, blocks * sizeof(int), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hr.data(), rk, blocks * sizeof(int), cudaMemcpyDeviceToHost));
      fprintf(out, "{\"cluster_size\": %d, \"launch\": %d, \"max_active_clusters\": %d, \"blocks\": [", cs, rep, nclusters);
      for (int b = 0; b < blocks; ++b) fprintf(out, "%s[%d, %d, %d, %d]", b ? ", " : "", b, hc[b], hr[b], hs[b]);
      fprintf(out, "]}\n");
    }
  }
  CHECK(cudaFree(sm));
  CHECK(cudaFree(cl));
  CHECK(cudaFree(rk));
  if (path) fclose(out); else fflush(out);
  return 0;
}

#ifndef GPC_MAP_LIB
int main() { return gpc_map_run(nullptr); }
#endif
