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
 *   standin devices     prints the GPUs a DRA driver's kubelet plugin handed the container
 *                       (NVIDIA_VISIBLE_DEVICES and the claim, from its CDI edits), then waits
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* As PID 1 of its container a signal without a handler is ignored: end on SIGTERM, as a
 * training process does, rather than wait out the grace period. */
static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

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
  signal(SIGTERM, on_term);
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

static int devices(void) {
  signal(SIGTERM, on_term);
  const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
  const char *claim = getenv("GPU_DRA_STANDIN_CLAIM");
  printf("NVIDIA_VISIBLE_DEVICES=%s\n", visible ? visible : "(unset)");
  printf("GPU_DRA_STANDIN_CLAIM=%s\n", claim ? claim : "(unset)");
  fflush(stdout);
  for (;;) {
    pause();
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "train") == 0) {
    return train();
  }
  if (argc >= 2 && strcmp(argv[1], "devices") == 0) {
    return devices();
  }
  if (argc >= 3 && strcmp(argv[1], "alloc") == 0) {
    return alloc(strtol(argv[2], NULL, 10));
  }
  fprintf(stderr, "usage: standin train | standin alloc MIB | standin devices\n");
  return 2;
}
