/*
 * A stand-in for a training process on the local real node, which has no GPU: it fails the way
 * PyTorch does when a configuration does not fit, so the operator's recovery is tested against
 * the real kubelet and containerd.
 *
 *   standin train       without offload (OFFLOAD_MODE=disabled, as the operator writes it):
 *                       prints PyTorch's CUDA out-of-memory error and exits 1 (a job that does
 *                       not fit its GPU); with any offload: one "step" and exit 0
 *   standin alloc MIB   allocates and touches MIB MiB of host memory, then waits: under a
 *                       smaller cgroup memory limit the kernel's OOM killer ends it (OOMKilled)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int train(void) {
  const char *mode = getenv("OFFLOAD_MODE");
  if (mode == NULL || strcmp(mode, "disabled") == 0) {
    fprintf(stderr,
            "Traceback (most recent call last):\n"
            "  File \"/train.py\", line 42, in <module>\n"
            "    loss.backward()\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 139.80 GiB of which 1.10 GiB is free.\n");
    return 1;
  }
  printf("step 1: loss 10.37 (OFFLOAD_MODE=%s)\n", mode);
  return 0;
}

static int alloc(long mib) {
  for (long i = 0; i < mib; i++) {
    char *p = malloc(1 << 20);
    if (p == NULL) {
      fprintf(stderr, "malloc failed after %ld MiB\n", i);
      return 1;
    }
    memset(p, 1, 1 << 20);
  }
  printf("holding %ld MiB\n", mib);
  fflush(stdout);
  for (;;) {
    pause();
  }
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "train") == 0) {
    return train();
  }
  if (argc >= 3 && strcmp(argv[1], "alloc") == 0) {
    return alloc(strtol(argv[2], NULL, 10));
  }
  fprintf(stderr, "usage: standin train | standin alloc MIB\n");
  return 2;
}
