/* The pod sandbox ("pause") process of the real test nodes (tests/realnode):
 * no registry is reachable from the test machines, so containerd's
 * sandbox_image is this, built locally with `musl-gcc -static` and packed as
 * an OCI archive by tests/realnode/pause-image.sh.
 *
 * It sleeps in pause() until SIGTERM or SIGINT (exit 0) and, being PID 1 of
 * the pod when the PID namespace is shared, reaps every child it inherits.
 *
 * `pause linger SECONDS FILE` is the tests' slow-stopping workload: on
 * SIGTERM it appends `term <ms since epoch>` to FILE, keeps running for
 * SECONDS, appends `exit <ms>` and exits, so a test can see on the host
 * whether its grace period was honoured. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static const char *linger_file;
static unsigned linger_secs;

static void mark(const char *word) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  FILE *f = fopen(linger_file, "a");
  if (!f) return;
  fprintf(f, "%s %llu\n", word, (unsigned long long)tv.tv_sec * 1000ULL + (unsigned long long)tv.tv_usec / 1000ULL);
  fclose(f);
}

static void linger(int sig) {
  (void)sig;
  mark("term");
  unsigned left = linger_secs;
  while (left > 0) left = sleep(left);
  mark("exit");
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
    puts("pause (nodekeeper tests)");
    return 0;
  }
  if (getpid() != 1) {
    /* Like upstream's: harmless elsewhere, but say so. */
    fputs("pause: warning: not running as PID 1\n", stderr);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = stop;
  if (argc == 4 && strcmp(argv[1], "linger") == 0) {
    linger_secs = (unsigned)strtoul(argv[2], NULL, 10);
    linger_file = argv[3];
    sa.sa_handler = linger;
  }
  if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) return 1;
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &sa, NULL) < 0) return 2;
  for (;;) pause();
  return 42; /* not reached */
}
