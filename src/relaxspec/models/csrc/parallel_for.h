/* parallel_for: f over [0, n) split between the threads of the process's OpenMP runtime (torch's, with torch's
   thread count), as torch's at::parallel_for splits a range (OpenMP backend). Shared by the models' kernels
   (int4_block.c, gguf_block.c), which split outputs this way, never a dot product. */
#ifndef RELAXSPEC_PARALLEL_FOR_H
#define RELAXSPEC_PARALLEL_FOR_H
#include <omp.h>
#include <stdint.h>

typedef void (*range_fn)(const void* arg, int64_t begin, int64_t end);

/* f over [0, n) in chunks of at least `grain`, one per thread: serially where n <= grain, inside a parallel region,
   or with one thread. */
static void parallel_for(int64_t n, int64_t grain, range_fn f, const void* p) {
  if (n <= 0) return;
  if (n <= grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(p, 0, n);
    return;
  }
#pragma omp parallel
  {
    int64_t threads = omp_get_num_threads();
    const int64_t most = (n + grain - 1) / grain;
    threads = threads < most ? threads : most;
    const int64_t chunk = (n + threads - 1) / threads, begin = omp_get_thread_num() * chunk;
    if (begin < n) f(p, begin, begin + chunk < n ? begin + chunk : n);
  }
}

#endif
